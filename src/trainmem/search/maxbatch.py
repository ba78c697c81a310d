"""The largest micro-batch that fits a card: searched on the estimate, confirmed with few real runs.

Every search takes a `fits(batch) -> bool` oracle, assumed monotone (a batch that fits means every
smaller one fits), so the same code runs against the estimator, a real GPU, or a test's fake memory
model. `Oracle` counts the distinct batches it was asked about: for the real runs, that is the cost.

Real runs say more than yes or no: they measure the bytes they used. `Measured` keeps those bytes and
`newton` uses them, stepping from the last run by its headroom over the per-sample slope (measured
between runs `SPAN` or more samples apart, the estimate's before), so a prediction that is off by many
samples is corrected in one step instead of a gallop. That is why the confirming runs are given a
relaxed cap (`RELAX` times the card): a run over the card's budget still finishes and reports what it
needed. A run whose peak stays within the budget never reaches either cap, so it is exactly the run the
card would see.

`max_batch` is what `trainmem max-batch` does: the search on the estimate, then, with CUDA, the
confirming runs; the searches above take only oracles, so they need neither torch nor a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainmem.config.setup import ESTIMATORS, TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.hardware.gpus import GPU, find_gpu, margin_problem

LIMIT = 1 << 16
"""No search goes past this micro-batch: a model that fits this many samples needs no search."""

RELAX = 1.25
"""The confirming runs' cap, as a multiple of the card's allocator cap for the setup: room to measure a miss."""


@dataclass
class Oracle:
    """Memoises `fits` and records the batches tried, in order."""

    fits: Callable[[int], bool]
    tried: list[tuple[int, bool]] = field(default_factory=list)

    def __call__(self, batch: int) -> bool:
        for b, ok in self.tried:
            if b == batch:
                return ok
        ok = bool(self.fits(batch))
        self.tried.append((batch, ok))
        return ok

    @property
    def trials(self) -> int:
        """How many distinct batches were asked about: for real runs, what the search cost."""
        return len(self.tried)


def _bisect(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest b in [lo, hi) that fits, given fits(lo) (or lo == 0) and not fits(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest(fits: Callable[[int], bool], limit: int = LIMIT) -> int:
    """The largest batch in 1..limit that fits (0 if none): doubling to a failure, then bisection."""
    if not fits(1):
        return 0
    lo = 1
    while lo < limit:
        hi = min(lo * 2, limit)
        if not fits(hi):
            return _bisect(fits, lo, hi)
        lo = hi
    return limit


class Measured(Oracle):
    """An Oracle over real runs that keeps what they measured: `measure(batch)` returns the bytes the run
    needed on the card (peak reserved plus the setup's memory outside the allocator), or None when it ran out
    of memory even under the relaxed cap. A batch fits when its bytes are within `budget`."""

    def __init__(self, measure: Callable[[int], int | None], budget: int):
        self.measure, self.budget = measure, budget
        self.used: dict[int, int | None] = {}
        super().__init__(self._fits)

    def _fits(self, batch: int) -> bool:
        m = self.used[batch] = self.measure(batch)
        return m is not None and m <= self.budget


def newton(runs: Measured, start: int, slope: Callable[[int], float], limit: int = LIMIT) -> int:
    """The largest batch whose run fits `runs.budget`, starting from a prediction: each next run is the
    batch where the last run's measured bytes reach the budget, kept inside the bracket of known fits and
    misses (a step that leaves it bisects instead); it ends when the bracket closes. A right prediction
    costs 2 runs (it and the next). `slope(b)` is the estimate's bytes per sample near b, replaced by the
    measured slope between the last two runs once they are `SPAN` or more samples apart."""
    lo, hi = 0, limit + 1  # the largest batch known to fit, the smallest known not to
    b = max(1, min(start, limit))
    while True:
        if runs(b):
            lo = max(lo, b)
        else:
            hi = min(hi, b)
        if hi - lo <= 1:
            return lo
        b = _step(runs, b, lo, hi, slope)


SPAN = 4
"""Runs this many samples apart or more give a measured slope; closer ones are lost in allocator steps
(real peaks are not monotone at that scale: polyglot-ko-1.3b at batch 127 reserved less than at 122)."""


def _step(runs: Measured, last: int, lo: int, hi: int, slope: Callable[[int], float]) -> int:
    m = runs.used[last]
    if m is None:  # out of memory even under the relaxed cap: nothing to step from
        return max(lo + 1, (lo + hi) // 2)
    per_sample = slope(last)
    before = [(b, u) for b, u in runs.used.items() if u is not None and abs(b - last) >= SPAN]
    if before:
        b0, m0 = before[-1]
        if (m - m0) / (last - b0) > 0:
            per_sample = (m - m0) / (last - b0)
    if per_sample <= 0:
        return max(lo + 1, (lo + hi) // 2)
    guess = last + math.floor((runs.budget - m) / per_sample)
    if lo < guess < hi:
        return guess
    if guess == lo:  # the step says lo is the answer: the run above it settles that
        return lo + 1
    if guess == hi:
        return hi - 1
    return max(lo + 1, (lo + hi) // 2)  # the step overshot what is already known: bisect


def settle(fits: Callable[[int], bool], start: int, limit: int = LIMIT) -> int:
    """The largest batch that fits, searched from a close guess `start` (0: nothing fits there): galloping
    up from it while batches fit, or down while they do not, then bisection. A right guess costs 2 trials."""
    start = min(max(start, 1), limit)
    if fits(start):
        lo, step = start, 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, step * 2
        return _bisect(fits, lo, min(lo + step, limit + 1))
    hi, step = start, 1
    while hi - step >= 1 and not fits(hi - step):
        hi, step = hi - step, step * 2
    lo = max(hi - step, 0)
    return _bisect(fits, lo, hi)


MISSES = 3
"""Batches in a row above the largest fitting one that must miss before the search stops: near the card's capacity
memory is not monotone in batch (the allocator's block layout: polyglot-ko-1.3b in fp16 on a T4 is `tight` at
batch 5 and 7, `fits` at 6 and 8), so one miss is not the end."""


def scan(level: Callable[[int], str], found: int, misses: int = MISSES, limit: int = LIMIT) -> tuple[int, list[int]]:
    """The largest batch that fits, checked upward from `found` (what a monotone search found) until `misses`
    batches in a row do not fit or one needs more than the card (`level` says `no`): that batch, and the
    batches below it that do not fit (empty where memory is monotone up to it)."""
    best, gaps, b, run = found, [], found + 1, 0
    while run < misses and b <= limit:
        at = level(b)
        if at == "fits":
            gaps += list(range(best + 1, b))
            best, run = b, 0
        elif at == "no":
            break
        else:
            run += 1
        b += 1
    return best, gaps


def power_of_two(fits: Callable[[int], bool], limit: int = LIMIT) -> tuple[int, int]:
    """What the usual manual search finds and costs: try 1, 2, 4, ... until one fails.
    Returns (the largest power of two that fits or 0, the number of trials)."""
    best, trials, b = 0, 0, 1
    while b <= limit:
        trials += 1
        if not fits(b):
            break
        best, b = b, b * 2
    return best, trials


def accumulation_for(target: int, batch: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) reaching exactly `target` samples per step: the largest
    micro-batch <= `batch` that divides `target`."""
    micro = max(d for d in range(1, min(batch, target) + 1) if target % d == 0)
    return micro, target // micro


class RunFailed(RuntimeError):
    """A confirming run failed for a reason other than memory: the search cannot go on without its bytes."""


def _real_runs(spec: ModelSpec, setup: TrainSetup, card: GPU, margin: float) -> tuple[Measured, list[str]]:
    """Real runs on this GPU, each measuring what the card would need (peak reserved + its context).

    They run under a relaxed cap, not the card's: a run within the budget never reaches a cap, so it is
    the card's run exactly, and a run over it still reports how far over, which is what `newton` steps by."""
    import torch

    from trainmem.isolation.runner import run

    resolved = setup.resolved(spec)
    precision = resolved.resolved_precision(spec, "cuda")
    # what the estimate adds to reserved bytes for this card and setup (context, fused-attention kernels):
    # the one rule by which estimates and real runs are judged against `card.budget`
    outside = card.overhead(resolved.attention, precision, resolved.peft)
    cap = card.allocator_cap(resolved.attention, precision, resolved.peft)
    total = torch.cuda.get_device_properties(0).total_memory
    relaxed = min(int(RELAX * cap), total)
    notes = [] if total >= cap else [
        f"this GPU has {total / 2**30:.1f} GiB, less than the {card.name}'s {cap / 2**30:.1f} GiB: "
        "batches that need more than this GPU cannot be confirmed and count as not fitting"]

    def measure(b: int) -> int | None:
        row = run(spec, setup.replace(batch_size=b, gpu=None, memory_cap=relaxed))
        if row.status == "oom":
            return None
        if row.status != "ok":
            last = (row.error or "").strip().splitlines()[-1:] or ["no error text"]
            raise RunFailed(f"the real run at batch {b} failed: {last[0]}")
        return int(row.memory["peak_reserved"]) + outside

    return Measured(measure, card.budget(margin)), notes


def _slope(reserved: Callable[[int], int]) -> Callable[[int], float]:
    """Bytes per sample of the estimate around b, over a few samples so allocator steps average out."""
    def slope(b: int) -> float:
        k = max(1, b // 16)
        return (reserved(b + k) - reserved(b)) / k
    return slope


def problems(target: int | None, estimator: str, gpu: str | None, grad_accum_given: bool) -> list[str]:
    """Every problem of max-batch's own options but the margin (`gpus.margin_problem`); the setup's are
    `TrainSetup.validate`'s."""
    out: list[str] = []
    if target is not None and (not isinstance(target, int) or target < 1):
        out.append(f"--target-batch: expected a whole number >= 1, got {target!r}")
    if target is not None and grad_accum_given:
        out.append("--grad-accum: --target-batch chooses the accumulation; drop one of them")
    if gpu is None:
        out.append("--gpu: max-batch needs the card to fit, e.g. --gpu T4 (see `trainmem run --help`); "
                   "with CUDA it defaults to this machine's card")
    if estimator not in ESTIMATORS:
        out.append(f"--estimator: {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    return out


def max_batch(spec: ModelSpec, setup: TrainSetup, margin: float = 0.02, target: int | None = None,
              estimator: str = "auto", searching: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """The largest micro-batch of `setup` that fits `setup.gpu` (this machine's card when None), leaving
    `margin` of its capacity free: searched on the estimate, then, with CUDA, confirmed with real runs.

    Args:
        target: an effective batch to reach; the answer then adds the micro-batch and accumulation for it.
        estimator: the estimate searched. `auto`: the analytic method (milliseconds a point) finds the
            neighbourhood, then the simulate method (what `trainmem estimate` says by default) settles the
            answer from there in a few simulations; `analytic` or `simulate` alone otherwise.
        searching: a context factory given what is being done (the CLI shows a spinner with it).
    Returns:
        The answer as `trainmem max-batch --json` prints it: `batch` (0 when nothing fits), `predicted`,
        the runs `tried`, and what a power-of-two search would cost. Raises SetupError for bad options
        and RunFailed when a confirming run fails for a reason other than memory.
    """
    import contextlib

    import torch

    from trainmem.estimator import estimate

    if setup.gpu is None:
        from trainmem.hardware.gpus import this_card

        setup = setup.replace(gpu=this_card())  # with CUDA, no card named means the card this runs on
    found_problems = [p for p in [margin_problem(margin)] if p] + problems(
        target, estimator, setup.gpu, grad_accum_given=target is not None and setup.grad_accum != 1)
    if found_problems:
        raise SetupError(found_problems)
    status = searching or (lambda what: contextlib.nullcontext())
    card = find_gpu(setup.gpu)  # type: ignore[arg-type]
    # accumulation keeps the gradients resident between micro-batches, so search with it when it will be used
    searched = setup.replace(grad_accum=2) if target else setup
    levels: dict[tuple[str, int], str] = {}

    def level(method: str, b: int) -> str:
        """The estimate's verdict at batch b: the same call, and so the same answer, as `trainmem estimate`."""
        if (method, b) not in levels:
            levels[method, b] = estimate(spec, searched.replace(batch_size=b), method).verdict(card, margin)["level"]
        return levels[method, b]

    def fits(method: str) -> Oracle:
        return Oracle(lambda b: level(method, b) == "fits")

    predicted_by = fits("analytic" if estimator == "auto" else estimator)
    with status(f"searching the estimate of {spec.name} on {card.name}..."):
        predicted = largest(predicted_by)
    simulated = fits("simulate") if estimator == "auto" else None
    if simulated is not None:
        with status(f"settling batch {predicted} with the simulate method..."):
            predicted = settle(simulated, predicted)
    final = "simulate" if simulated is not None else estimator
    with status(f"checking the batches above {predicted} (near the card memory is not monotone in batch)..."):
        predicted, gaps = scan(lambda b: level(final, b), predicted) if predicted else (predicted, [])
    real = torch.cuda.is_available() and setup.device != "cpu"
    answer: dict[str, Any] = {"model": spec.name, "gpu": card.name, "margin": margin, "predicted": predicted,
                              "estimates": sum(m == "analytic" for m, _ in levels),
                              "simulations": sum(m == "simulate" for m, _ in levels), "not_monotone": gaps,
                              "method": "simulate" if simulated is not None else estimator, "confirmed": real}
    if real:
        runs, notes = _real_runs(spec, searched, card, margin)
        slope = _slope(lambda b: estimate(spec, searched.replace(batch_size=b), "analytic").memory["peak_reserved"])
        with status(f"confirming batch {predicted} with real runs measured against the {card.name}..."):
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
    return answer


__all__ = ["Oracle", "Measured", "largest", "settle", "scan", "MISSES", "newton", "power_of_two", "accumulation_for", "max_batch", "problems",
           "RunFailed", "LIMIT", "RELAX"]
