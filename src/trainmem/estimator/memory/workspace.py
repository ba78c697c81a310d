"""A simulated step on another card's cuBLAS workspace, without simulating it again.

Cards whose runtimes differ only in the bytes each cuBLAS handle holds (`GPU.cublas_workspace`: 32 MiB and more
on Hopper, 8 MiB before it) simulate the same operators: the workspace enters a simulated step only as the two
allocations `CudaKernels` holds at a handle's first matrix product (`TensorLedger.hold`). Resizing those two
events gives the other card's events exactly; its peak is the same event's where that event stays the first to
reach the most live bytes, and its split then differs only in `other`, by what the holds before it changed. Where
the peak moves to another event (whose split no ledger recorded), `with_workspace` returns None and the caller
simulates the step on that card, as before.
"""

from __future__ import annotations

from typing import Any

from .allocator import live_peak_at
from .compose import ComposedStep


def with_workspace(step: Any, workspace: int) -> Any:
    """`step` (a recording `TensorLedger` or a `ComposedStep`) as simulated with `workspace` bytes per cuBLAS
    handle (`step` itself where nothing changes), or None where that cannot be told without simulating it."""
    if not hasattr(step, "holds"):  # not a recorded step (a ZeRO rank's excess): simulated on the card
        return None
    holds = set(step.holds)
    events = step.events or []
    sizes = {n for key, n in events if key in holds and n >= 0}
    if not holds or sizes == {workspace}:
        return step
    if len(sizes) != 1:
        return None
    delta = workspace - sizes.pop()
    peak, at = live_peak_at(events)
    if peak != step.peak:  # the ledger counted bytes its events do not show
        return None
    resized = [(key, workspace) if key in holds and n >= 0 else (key, n) for key, n in events]
    new_peak, new_at = live_peak_at(resized)
    before = sum(1 for key, n in events[:at + 1] if key in holds and n >= 0)
    split = dict(step.peak_split)
    if new_at != at or split.get("other", 0) < max(-delta * before, 1):
        return None  # another event peaks, or `other` was clamped at zero: simulate this card's step
    split["other"] += delta * before
    assert new_peak == peak + delta * before
    return _composed(step, resized, new_peak, split)


def _composed(step: Any, events: list[tuple[Any, int]], peak: int, split: dict[str, int]) -> ComposedStep:
    return ComposedStep(events, dict(step.marks), peak, split, step.peak_phase,
                        bool(getattr(step, "balanced_routing", False)), tuple(step.holds))

