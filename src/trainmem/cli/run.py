"""Train a setup for a few real steps and measure its memory phase by phase.

Each experiment runs in a fresh process; an out-of-memory is a result (status oom), not a crash.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from trainmem.errors import SetupError
from trainmem.isolation.runner import run
from trainmem.output.render import print_result
from trainmem.result import out_problems

from . import options


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p)
    options.add_output(p, "the result object")
    p.add_argument("--phases", action="store_true", help="also print the phase-by-phase table")
    p.add_argument("--no-isolate", action="store_true", help="run in this process (faster, may leak memory)")


def main(args: argparse.Namespace) -> int:
    if args.out and out_problems(args.out):  # first, alone and at once: where the row goes, not the setup
        raise SetupError(out_problems(args.out))
    spec, setup = options.setup_from_args(args)
    console = Console(stderr=args.json)
    with console.status(f"training {spec.name} ({spec.source}) for {setup.steps} steps..."):
        result = run(spec, setup, isolate=not args.no_isolate)
    for note in result.append_to(args.out) if args.out else []:
        Console(stderr=True).print(f"warning: {note}", style="yellow", markup=False, soft_wrap=True)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        print_result(result, console, phases=args.phases)
        if spec.source in ("preset", "config") and args.model is None and setup.resolved_device() == "cpu":
            console.print(f"[dim]No GPU here: ran the tiny preset {spec.name} on the CPU. On a GPU the default "
                          "is the seed's EleutherAI/polyglot-ko-1.3b; pass --model to choose.[/dim]")
            _seed_estimate(console)
    return 0 if result.status in ("ok", "oom") else 1


def _seed_estimate(console: Console) -> None:
    """What a user learns without a GPU: the seed's run estimated for the chapter's card."""
    from trainmem.config.setup import TrainSetup
    from trainmem.estimator import estimate
    from trainmem.output.render import size

    b = estimate("polyglot-ko-1.3b", TrainSetup(batch_size=4, precision="fp16", gpu="T4"), "analytic")
    v = b.verdict("T4")
    word = {"fits": "fits", "tight": "fits, tightly,", "no": "does not fit"}[v["level"]]
    console.print(f"Estimated without a GPU, the seed's run (polyglot-ko-1.3b, batch 4 x 256, fp16, AdamW) on a "
                  f"T4: peak {size(b.peak)} in the {b.peak_phase}, "
                  f"{word} with {size(v['headroom'])} to spare. "
                  "Try: trainmem estimate --model polyglot-ko-1.3b --precision fp16 --batch-size 16 --gpu T4")
