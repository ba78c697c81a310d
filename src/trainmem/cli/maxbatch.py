"""Find the largest micro-batch that fits a card: searched on the estimate, confirmed with few real runs.

Takes the setup flags of `trainmem run` but --batch-size (searched) and --memory-cap, and `--gpu NAME`
(required). With CUDA, the estimate's answer is confirmed by real runs (the predicted batch and the next one
when the estimate is right, a Newton step on the measured bytes when it is not; see `trainmem.search.maxbatch`);
without, the answer is the estimate's.
`--target-batch N` adds the accumulation that reaches N samples a step.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape

from trainmem.output.render import json_line, print_max_batch
from trainmem.search.maxbatch import RunFailed, max_batch, problems

from . import options


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p, command="max-batch")
    p.add_argument("--target-batch", metavar="N", help="the effective batch to reach with accumulation")
    options.add_margin(p)
    options.add_estimator(p, "--estimator", "auto", ": the estimate searched (default auto: analytic to find "
                          "the neighbourhood, simulate to settle it, as `trainmem estimate` judges)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")


def main(args: argparse.Namespace) -> int:
    found: list[str] = []
    margin = options.margin(args, found)
    target = None
    if args.target_batch is not None:
        try:
            target = int(args.target_batch)
        except ValueError:
            target = args.target_batch
    if args.gpu is None:
        from trainmem.hardware.gpus import this_card

        args.gpu = this_card()  # with CUDA, --gpu left out means the card this runs on
    found += problems(target, args.estimator, args.gpu, grad_accum_given=args.grad_accum is not None)
    spec, setup = options.setup_from_args(args, found)
    console = Console(stderr=args.json)
    try:
        answer = max_batch(spec, setup, margin, target, args.estimator, searching=lambda text: console.status(escape(text)))
    except RunFailed as e:
        raise SystemExit(f"trainmem max-batch: {e}") from None
    if args.json:
        sys.stdout.write(json_line(answer) + "\n")
    else:
        print_max_batch(answer, target, console)
    return 0 if answer["batch"] else 1
