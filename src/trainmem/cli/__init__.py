"""`trainmem` command line: one module per subcommand, registered here."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from ..errors import SetupError
from . import estimate as estimate_cmd
from . import maxbatch as maxbatch_cmd
from . import plan as plan_cmd
from . import report as report_cmd
from . import run as run_cmd
from . import serve as serve_cmd
from . import sweep as sweep_cmd
from . import verify as verify_cmd

COMMANDS = {"run": run_cmd, "estimate": estimate_cmd, "verify-accumulation": verify_cmd, "sweep": sweep_cmd,
            "max-batch": maxbatch_cmd, "report": report_cmd, "plan": plan_cmd,
            "serve": serve_cmd}


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` into one subcommand's flags and run it; a SetupError becomes its problems on stderr and exit 2."""
    parser = argparse.ArgumentParser(prog="trainmem", description="Plan, measure and explain GPU memory "
                                     "when fine-tuning causal language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.register(sub.add_parser(name, help=module.__doc__.splitlines()[0],
                                       description=module.__doc__))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].main(args)
    except SetupError as e:
        Console(stderr=True).print(f"[red]trainmem {args.command}: the setup cannot run:[/red]\n{e}",
                                   highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
