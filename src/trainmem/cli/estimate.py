"""Predict the memory of a setup on a CUDA GPU without one, and say whether it fits a card.

Takes exactly the setup flags of `trainmem run`; `--method analytic|simulate|auto` picks how.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from ..errors import SetupError
from ..estimator import METHODS, estimate
from ..render import print_result
from .options import add_setup_arguments, setup_from_args


def register(p: argparse.ArgumentParser) -> None:
    add_setup_arguments(p)
    p.add_argument("--method", default="auto", help=f"{'|'.join(METHODS)} (default auto: simulate where it "
                   "models the setup, analytic otherwise)")
    p.add_argument("--margin", default="0.02", help="headroom kept free on the card, a fraction of its capacity (default 0.02)")
    p.add_argument("--json", action="store_true", help="print the result object as JSON")
    p.add_argument("--out", metavar="FILE.jsonl", help="append the result object to this file")


def main(args: argparse.Namespace) -> int:
    spec, setup = setup_from_args(args)
    try:
        margin = float(args.margin)
        if not 0 <= margin < 1:
            raise ValueError
    except ValueError:
        raise SetupError([f"--margin: expected a fraction in [0, 1), got {args.margin!r}"]) from None
    console = Console(stderr=args.json)
    if setup.gpu is None and setup.device != "cpu":
        from ..gpus import this_card

        here = this_card()  # with CUDA, --gpu left out means the card this runs on
        setup = setup.replace(gpu=here) if here else setup
    with console.status(f"estimating {spec.name}..."):
        breakdown = estimate(spec, setup, args.method)
    result = breakdown.to_result(setup.gpu, margin)
    if args.out:
        result.append_to(args.out)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        print_result(result, console)
    return 0
