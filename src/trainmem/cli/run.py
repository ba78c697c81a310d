"""Train a setup for a few real steps and measure its memory phase by phase.

Each experiment runs in a fresh process; an out-of-memory is a result (status oom), not a crash. With --gpu
the first line says whether the setup fits that card.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from rich.console import Console
from rich.markup import escape

from trainmem.errors import SetupError
from trainmem.isolation import launch
from trainmem.isolation.runner import run
from trainmem.output.render import json_line, print_result
from trainmem.result import out_problems

from . import options


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p, command="run")
    options.add_output(p, "the result object")
    p.add_argument("--phases", action="store_true", help="also print the phase-by-phase table")
    p.add_argument("--no-isolate", action="store_true", help="run in this process (faster, may leak memory)")
    p.add_argument("--launch", action="store_true", help="run the --gpus N ranks as N processes under torchrun "
                   "(NCCL on CUDA, gloo on the CPU) and merge their rows")
    p.add_argument("--print-only", action="store_true", help="with --launch: print its command, run nothing")


def main(args: argparse.Namespace) -> int:
    if args.out and out_problems(args.out):  # first, alone and at once: where the row goes, not the setup
        raise SetupError(out_problems(args.out))
    alone = args.print_only and not args.launch
    spec, setup = options.setup_from_args(args, ["--print-only: prints the command of --launch; add --launch"] * alone)
    if args.print_only:  # each rank writes its row to OUT_DIR/rank-R.json, the command's last argument
        sys.stdout.write(shlex.join(launch.prepare(spec, setup)) + "\n")
        return 0
    console = Console(stderr=args.json)
    with console.status(f"training {escape(spec.name)} ({spec.source}) for {setup.steps} steps..."):
        result = launch.launch(spec, setup) if args.launch else run(spec, setup, isolate=not args.no_isolate)
    for note in result.append_to(args.out) if args.out else []:
        Console(stderr=True).print(f"warning: {note}", style="yellow", markup=False, soft_wrap=True)
    if args.json:
        sys.stdout.write(json_line(result.to_dict()) + "\n")
    else:
        print_result(result, console, phases=args.phases, verbose=args.verbose)
    if args.default_model:
        cpu = setup.resolved_device() == "cpu"
        Console(stderr=args.json).print(
            f"no --model: ran {'the tiny preset ' if cpu else ''}{args.default_model} on the {'CPU' if cpu else 'GPU'}, "
            "the default there (EleutherAI/polyglot-ko-1.3b on a GPU, tiny-gpt-neox on the CPU); pass --model to "
            "choose", style="dim", markup=False, highlight=False)
        if cpu and not args.json:
            _chapter_estimate(console)
    return 0 if result.status in ("ok", "oom") else 1


def _chapter_estimate(console: Console) -> None:
    """What a user learns without a GPU: the tutorial chapter's run estimated for its card."""
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
