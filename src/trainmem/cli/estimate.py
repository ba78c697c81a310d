"""Predict the memory of a setup on a CUDA GPU without one, and say whether it fits a card.

Takes the setup flags of `trainmem run` (`--model` is required) but those only a training run uses (its engine,
rank, steps and dummy data); `--method analytic|simulate|auto` picks how. The first line is the answer: whether
it fits `--gpu` (or `--memory-cap`) and what to cut first.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape

from trainmem.errors import SetupError
from trainmem.output.render import json_line, print_result
from trainmem.result import Result, out_problems

from . import cache, options


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p, model_required=True, command="estimate")
    options.add_estimator(p, "--method", "auto", " (default auto: simulate where it models the setup, analytic otherwise)")
    options.add_margin(p)
    options.add_output(p, "the result object")


def main(args: argparse.Namespace) -> int:
    if args.out and out_problems(args.out):  # first, alone and at once: where the row goes, not the setup
        raise SetupError(out_problems(args.out))
    answer_key = cache.key(args)
    kept = cache.load(answer_key)
    if kept is not None:  # the same question, asked of the same trainmem and libraries: the same answer
        return _print(kept, args)
    problems: list[str] = []
    margin = options.margin(args, problems)
    spec, setup = options.setup_from_args(args, problems, default=None)
    from trainmem.estimator import estimate  # torch: only once the setup is known to be sound
    console = Console(stderr=args.json)
    if setup.gpu is None and setup.device != "cpu":
        from trainmem.hardware.gpus import this_card

        here = this_card()  # with CUDA, --gpu left out means the card this runs on
        setup = setup.replace(gpu=here) if here else setup
    with console.status(f"estimating {escape(spec.name)}..."):
        breakdown = estimate(spec, setup, args.method)
    result = breakdown.to_result(options.verdict_card(setup), margin)  # type: ignore[arg-type]
    if result.verdict and result.verdict["level"] != "fits":
        from trainmem.search.advice import check

        with console.status("checking what would make it fit..."):
            result.verdict["checked"] = check(spec, setup, breakdown, options.verdict_card(setup), margin, args.method)
    from trainmem.estimator import MAMBA_NOTES
    from trainmem.search.advice import other_mamba_path

    with console.status("estimating the other Mamba path..."):
        other = other_mamba_path(spec, setup, options.verdict_card(setup), margin, args.method)
    if other is not None:  # beside the note that names the path priced
        result.notes = [f"{n}; {other}" if n == MAMBA_NOTES[setup.mamba_path] else n for n in result.notes]
    cache.store(answer_key, result)
    for note in result.append_to(args.out) if args.out else []:
        Console(stderr=True).print(f"warning: {note}", style="yellow", markup=False, soft_wrap=True)
    return _print(result, args)


def _print(result: Result, args: argparse.Namespace) -> int:
    if args.json:
        sys.stdout.write(json_line(result.to_dict()) + "\n")
    else:
        print_result(result, Console(), verbose=args.verbose)
    return 0
