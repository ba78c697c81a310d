"""`trainmem` command line: one module per subcommand, registered here.

`main` is the one door: a SetupError becomes its problems on stderr, one line each, and exit 2; Ctrl-C becomes
"interrupted" and exit 130; anything else unexpected one line naming the error and exit 1 (TRAINMEM_DEBUG=1
raises it with its traceback). Third-party warnings and log lines are silenced unless `--verbose`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from trainmem.errors import Interrupted, SetupError, raise_on_signals

from . import estimate as estimate_cmd
from . import maxbatch as maxbatch_cmd
from . import plan as plan_cmd
from . import report as report_cmd
from . import run as run_cmd
from . import serve as serve_cmd
from . import sweep as sweep_cmd
from . import verify as verify_cmd

COMMANDS = {"run": run_cmd, "estimate": estimate_cmd, "verify-accumulation": verify_cmd, "sweep": sweep_cmd,
            "max-batch": maxbatch_cmd, "report": report_cmd, "plan": plan_cmd, "serve": serve_cmd}
THIRD_PARTY_LOGGERS = ("transformers", "huggingface_hub", "peft", "accelerate", "torch", "bitsandbytes")


def versions() -> str:
    """`trainmem --version`: trainmem's and the installed torch's and transformers' (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    from trainmem.version import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"trainmem {__version__} (torch {installed('torch')}, transformers {installed('transformers')})"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose "unrecognized arguments" error names the closest flag of the command typed (a
    misspelt `--offlaod` is otherwise only "unrecognized"; Python 3.11's argparse suggests nothing)."""

    flags: dict[str, list[str]] = {}
    """Each subcommand's `--flags` (set by `parser`)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            known = self.flags.get(getattr(parsed, "command", None) or "", [])
            hints = []
            for word in extras:
                flag = word.split("=")[0]
                # compared without the dashes every flag shares, so that only a near spelling is suggested
                close = difflib.get_close_matches(flag[2:], [k[2:] for k in known], n=1, cutoff=0.75) \
                    if flag.startswith("--") else []
                if close:
                    hints.append(f"{flag}: did you mean --{close[0]}?")
            self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))
        return parsed


def parser() -> argparse.ArgumentParser:
    """The command line: the subcommands, each with the shared `--verbose`."""
    top = _Parser(prog="trainmem", description="Plan, measure and explain GPU memory when "
                  "fine-tuning causal language models.")
    top.add_argument("--version", action="version", version=versions())
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--verbose", action="store_true",
                        help="also print the notes that every estimate repeats, and third-party warnings")
    sub = top.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.register(sub.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                                       parents=[shared]))
    top.flags = {name: [flag for action in command._actions for flag in action.option_strings if flag.startswith("--")]
                 for name, command in sub.choices.items()}
    return top


@contextlib.contextmanager
def third_party_quiet(verbose: bool) -> Iterator[None]:
    """Warnings (torch, transformers, peft, huggingface_hub UserWarnings...) and third-party log lines below
    errors silenced for the command, unless `verbose`; trainmem itself says what it has to say in notes.
    Restored afterwards, so that a caller of `main` (a test) keeps its own settings."""
    if verbose:
        yield
        return
    # read by transformers and huggingface_hub when first imported (later here, or in a worker process)
    quiet_env = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    set_env = [k for k in quiet_env if k not in os.environ]
    os.environ.update({k: quiet_env[k] for k in set_env})
    loggers = {name: logging.getLogger(name) for name in THIRD_PARTY_LOGGERS}
    levels = {name: lg.level for name, lg in loggers.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers.values():
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, lg in loggers.items():
                lg.setLevel(levels[name])
            for k in set_env:
                os.environ.pop(k, None)


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` into one subcommand's flags and run it; the exit status: 0 done, 1 a failed run or an
    internal error, 2 a setup that cannot run (each problem on one line of stderr), 128 + the signal when
    interrupted (the worker stopped and its temp folder removed first)."""
    command = "?"
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    raise_on_signals()  # SIGINT/SIGTERM unwind through the context managers, then exit 130/143
    try:
        args = parser().parse_args(argv)
        command = args.command
        with third_party_quiet(args.verbose):
            return COMMANDS[command].main(args)
    except SetupError as e:
        err.print(f"trainmem {command}: the setup cannot run:", style="red", markup=False)
        for problem in e.problems:
            err.print("- " + " ".join(str(problem).split()), markup=False)
        return 2
    except Interrupted as e:
        err.print(f"trainmem {command}: {e.message}", markup=False)
        return e.code
    except KeyboardInterrupt:
        err.print(f"trainmem {command}: interrupted", markup=False)
        return 130
    except Exception as e:
        if os.environ.get("TRAINMEM_DEBUG"):
            raise
        message = " ".join(str(e).split())[:500]
        err.print(f"trainmem {command}: internal error: {type(e).__name__}: {message}", markup=False)
        err.print("set TRAINMEM_DEBUG=1 for the traceback", style="dim", markup=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
