"""The largest micro-batch that fits a card: searched on the estimate, confirmed with few real runs.

Every search takes a `fits(batch) -> bool` oracle, assumed monotone (a batch that fits means every
smaller one fits), so the same code runs against the estimator, a real GPU, or a test's fake memory
model. `Oracle` counts the distinct batches it was asked about: for the real runs, that is the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

LIMIT = 1 << 16
"""No search goes past this micro-batch: a model that fits this many samples needs no search."""


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


def refine(fits: Callable[[int], bool], start: int, limit: int = LIMIT) -> int:
    """The largest batch that fits, starting from a prediction: `start` and `start + 1` settle it when the
    prediction is right; otherwise it gallops away from `start` (steps 1, 2, 4, ...) and bisects."""
    start = max(1, min(start, limit))
    if fits(start):
        lo, step = start, 1
        while lo < limit:
            hi = min(lo + step, limit)
            if not fits(hi):
                return _bisect(fits, lo, hi)
            lo, step = hi, step * 2
        return limit
    hi, step = start, 1
    while hi > 1:
        lo = max(hi - step, 1)
        if fits(lo):
            return _bisect(fits, lo, hi)
        hi, step = lo, step * 2
    return 0


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


__all__ = ["Oracle", "largest", "refine", "power_of_two", "accumulation_for", "LIMIT"]
