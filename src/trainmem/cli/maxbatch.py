"""Find the largest micro-batch that fits a card: searched on the estimate, confirmed with few real runs.

Takes the setup flags of `trainmem run` and `--gpu NAME` (required). With CUDA, the estimate's answer is
confirmed by real runs (the predicted batch and the next one when the estimate is right, a Newton step on
the measured bytes when it is not; see `trainmem.maxbatch`); without, the answer is the estimate's.
`--target-batch N` adds the accumulation that reaches N samples a step.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from ..errors import SetupError
from ..estimator import METHODS as ESTIMATORS
from ..estimator import estimate
from ..gpus import find_gpu
from ..maxbatch import RELAX, Measured, Oracle, accumulation_for, largest, newton, power_of_two
from ..runner import run
from .options import add_setup_arguments, setup_from_args


def register(p: argparse.ArgumentParser) -> None:
    add_setup_arguments(p)
    p.add_argument("--target-batch", metavar="N", help="the effective batch to reach with accumulation")
    p.add_argument("--margin", default="0.02", help="headroom kept free on the card, a fraction of its capacity (default 0.02)")
    p.add_argument("--estimator", default="analytic", help=f"{'|'.join(ESTIMATORS)}: the estimate searched "
                   "(default analytic: milliseconds a point, so the search is free)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")


def _options(args: argparse.Namespace) -> tuple[float, int | None]:
    problems = []
    margin = target = None
    try:
        margin = float(args.margin)
        if not 0 <= margin < 1:
            raise ValueError
    except ValueError:
        problems.append(f"--margin: expected a fraction in [0, 1), got {args.margin!r}")
    if args.target_batch is not None:
        try:
            target = int(args.target_batch)
            if target < 1:
                raise ValueError
        except ValueError:
            problems.append(f"--target-batch: expected a whole number >= 1, got {args.target_batch!r}")
        if args.grad_accum is not None:
            problems.append("--grad-accum: --target-batch chooses the accumulation; drop one of them")
    if args.gpu is None:
        from ..gpus import this_card

        args.gpu = this_card()  # with CUDA, --gpu left out means the card this runs on
    if args.gpu is None:
        problems.append("--gpu: max-batch needs the card to fit, e.g. --gpu T4 (see `trainmem run --help`); "
                        "with CUDA it defaults to this machine's card")
    if args.estimator not in ESTIMATORS:
        problems.append(f"--estimator: {args.estimator!r} is not one of {', '.join(ESTIMATORS)}")
    if problems:
        raise SetupError(problems)
    return margin, target  # type: ignore[return-value]


def main(args: argparse.Namespace) -> int:
    import torch

    margin, target = _options(args)
    spec, setup = setup_from_args(args)
    card = find_gpu(setup.gpu)  # type: ignore[arg-type]
    # accumulation keeps the gradients resident between micro-batches, so search with it when it will be used
    searched = setup.replace(grad_accum=2) if target else setup
    predicted_by = Oracle(lambda b: estimate(spec, searched.replace(batch_size=b), args.estimator).fits(card, margin))
    console = Console(stderr=args.json)
    with console.status(f"searching the estimate of {spec.name} on {card.name}..."):
        predicted = largest(predicted_by)
    real = torch.cuda.is_available() and setup.device != "cpu"
    answer: dict[str, Any] = {"model": spec.name, "gpu": card.name, "margin": margin, "predicted": predicted,
                              "estimates": predicted_by.trials, "confirmed": real}
    if real:
        runs, notes = _real_runs(spec, searched, card, margin)
        slope = _slope(lambda b: estimate(spec, searched.replace(batch_size=b), args.estimator).memory["peak_reserved"])
        with console.status(f"confirming batch {predicted} with real runs measured against the {card.name}..."):
            found = newton(runs, predicted, slope)
        answer.update(batch=found, trials=runs.trials, tried=runs.tried, budget=runs.budget,
                      measured=dict(runs.used), notes=notes)
    else:
        found = predicted
        answer.update(batch=found, trials=0, tried=[])
    # monotone: a batch fits iff it is <= the answer, so the power-of-two search's cost follows from it
    answer["power_of_two"], answer["power_of_two_trials"] = power_of_two(lambda b: b <= found)
    if target and found:
        answer["micro_batch"], answer["grad_accum"] = accumulation_for(target, found)
    if args.json:
        sys.stdout.write(json.dumps(answer) + "\n")
        return 0 if found else 1
    _print(console, answer, target)
    return 0 if found else 1


def _real_runs(spec: Any, setup: Any, card: Any, margin: float) -> tuple[Measured, list[str]]:
    """Real runs on this GPU, each measuring what the card would need (peak reserved + its context).

    They run under a relaxed cap, not the card's: a run within the budget never reaches a cap, so it is
    the card's run exactly, and a run over it still reports how far over, which is what `newton` steps by."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    relaxed = min(int(RELAX * card.usable), total)
    notes = [] if total >= card.usable else [
        f"this GPU has {total / 2**30:.1f} GiB, less than the {card.name}'s {card.usable / 2**30:.1f} GiB: "
        "batches that need more than this GPU cannot be confirmed and count as not fitting"]

    def measure(b: int) -> int | None:
        row = run(spec, setup.replace(batch_size=b, gpu=None, memory_cap=relaxed))
        if row.status == "oom":
            return None
        if row.status != "ok":
            last = (row.error or "").strip().splitlines()[-1:] or ["no error text"]
            raise SystemExit(f"trainmem max-batch: the real run at batch {b} failed: {last[0]}")
        return int(row.memory["peak_reserved"]) + card.context

    return Measured(measure, card.budget(margin)), notes


def _slope(reserved: Any) -> Any:
    """Bytes per sample of the estimate around b, over a few samples so allocator steps average out."""
    def slope(b: int) -> float:
        k = max(1, b // 16)
        return (reserved(b + k) - reserved(b)) / k
    return slope


def _print(console: Console, a: dict[str, Any], target: int | None) -> None:
    if not a["batch"]:
        console.print(f"[red]Not even batch 1 fits {a['model']} on the {a['gpu']}[/red] (margin {a['margin']:.0%}); "
                      "`trainmem estimate --batch-size 1 --gpu ...` says what to cut first.")
        return
    tried = ", ".join(f"{b} {'fits' if ok else 'does not'}" for b, ok in a["tried"])
    how = (f"confirmed with {a['trials']} real runs ({tried})" if a["confirmed"] else f"from the estimate ({a['estimates']} estimates; no CUDA device here, so no real run)")
    console.print(f"Largest micro-batch for {a['model']} on the {a['gpu']}: [bold]{a['batch']}[/bold], {how}.",
                  highlight=False)
    console.print(f"A power-of-two search (1, 2, 4, ...) would take {a['power_of_two_trials']} real runs and find "
                  f"{a['power_of_two']}.", highlight=False)
    if target:
        micro, accum = a["micro_batch"], a["grad_accum"]
        why = "" if micro == min(a["batch"], target) else (
            f" ({a['batch']} does not divide {target}: {micro} is the largest micro-batch below it that does)")
        console.print(f"Effective batch {target}: --batch-size {micro} --grad-accum {accum}{why}.", highlight=False)
