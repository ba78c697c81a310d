"""The simulate method for a DeepSpeed ZeRO-1 or ZeRO-2 rank (`--shard zero1|zero2`).

Stages 1 and 2 partition the optimizer states (and stage 2 the gradients) but keep every parameter whole
(DeepSpeed's `stage_1_and_2.py`): each rank runs the whole model's forward and backward on its own micro-batch,
exactly as one GPU does. So what the rank's forward and backward hold beyond its weights, gradients and
optimizer states is what the single-GPU step holds beyond them: the simulated step of the same model and micro-
batch gives it, and the rank's states come from DeepSpeed's partitioning (`sharding.rank_states`). The reserved
bytes stay the analytic ratio: DeepSpeed's own buckets and partitions are not simulated.

The optimizer step is DeepSpeed's (`StepPeak`): it flattens the rank's gradient partition and casts it to fp32
while the gradients it was flattened from still exist, then steps the wrapped optimizer on the fp32 partition.

A deep model of uniform layers is not simulated whole: its cut models' figures (`compose.CUTS` layers) grow by
the same bytes a layer, and are extended to the full depth; where they do not, the whole model is simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from trainmem.config.setup import TrainSetup
from trainmem.forked import at_once
from trainmem.measure.ledger import EMPTY_CACHE, STREAM, TensorLedger

from . import compose
from .simulate import STEPS, steady_start

SHARDS = ("zero1", "zero2")
"""The ZeRO stages whose ranks run the unsharded forward and backward."""


@dataclass(frozen=True)
class Excess:
    """The most bytes the steady step's forwards and backwards hold beyond the weights, gradients and optimizer
    states (ZeRO-1: beyond the weights and optimizer states), and how many of them the forward saved for backward
    (activations) at that point."""

    bytes: int
    activations: int
    gradients: int = 0
    """ZeRO-1: the gradients among `bytes` (a stage-1 rank keeps each whole until its backward's end)."""


@dataclass(frozen=True)
class StepPeak:
    """The most a ZeRO-1/2 rank's optimizer step holds beyond its weights and optimizer states, on the fullest rank:
    `gradients` (the gradient bytes then alive) and `other` (DeepSpeed's flat and fp32 copies of the partition and
    the wrapped optimizer's temporaries)."""

    gradients: int
    other: int
    moment: str
    """Which moment of the step: "flatten" (the partition flattened and cast to fp32) or "update" (the wrapped
    optimizer's step on the fp32 partition)."""
    rank: int
    """The fullest rank (the first of equals)."""


ALIGNMENT = 2
"""DeepSpeed pads the flat group of trainable parameters to a multiple of `nccl_start_alignment_factor` (2) times
the world size, so that each rank's partition is the same size (`stage_1_and_2.py`)."""


def optimizer_step(sizes: Sequence[int], world: int, grad_bytes: int, foreach: bool) -> StepPeak:
    """DeepSpeed 0.19's ZeRO-1/2 `step()` without offload, for trainable parameters of `sizes` elements (in the
    order the optimizer holds them) whose gradients take `grad_bytes` bytes an element, over `world` ranks.

    A rank's gradients are those of every parameter that overlaps its partition, whole (the contiguous
    `grads_in_partition`; a ZeRO-1 rank has freed the others' by then). `step()` first flattens the partition's
    slices of them (`flatten`: one more partition in their dtype) and casts that to fp32 (`.to`: a copy unless they
    are fp32 already) before it frees them; last, the wrapped optimizer steps the fp32 partition, foreach AdamW
    with one temporary as large. The fullest rank is the one whose partition's parameters reach furthest past its
    bounds (docs/lab/zero-optimizer-step-2026-12-07.md)."""
    total = -(-sum(sizes) // (ALIGNMENT * world)) * ALIGNMENT * world
    part = total // world
    if not part:  # nothing trainable: no gradients to flatten
        return StepPeak(0, 0, "flatten", 0)
    overlapping = [0] * world
    start = 0
    for n in sizes:
        if n:
            for r in range(start // part, (start + n - 1) // part + 1):
                overlapping[r] += n
        start += n
    fp32, fullest = 4 * part, overlapping.index(max(overlapping))
    flatten = StepPeak(grad_bytes * overlapping[fullest], grad_bytes * part + (fp32 if grad_bytes != 4 else 0),
                       "flatten", fullest)
    update = StepPeak(fp32, fp32 if foreach else 0, "update", fullest)
    return max(flatten, update, key=lambda p: p.gradients + p.other)


def simulates(setup: TrainSetup) -> bool:
    """Which ZeRO setups this method prices: stages 1 and 2 without QLoRA (whose 4-bit build DeepSpeed does not
    partition) and without parameter offload (a ZeRO-3 feature)."""
    return setup.shard in SHARDS and setup.peft != "qlora" and setup.offload in ("none", "optimizer")


def single_gpu(setup: TrainSetup) -> TrainSetup:
    """The same micro-batches on one GPU: what a ZeRO-1/2 rank's forward and backward run (DeepSpeed's engine
    around trainmem's loop runs the loop's; TRL's runs its own loss head)."""
    return setup.replace(gpus=1, shard="none", offload="none", rank=None, nodes=1, gpus_per_node=None,
                         engine="loop" if setup.engine == "deepspeed" else setup.engine)


def excess(ledger: TensorLedger, whole_gradients: bool = False) -> Excess:
    """The steady step's most bytes beyond the states (`Excess`), from a ledger recorded with `splits`: the live
    bytes at each allocation of its forwards and backwards, less the weights, gradients and optimizer states the
    ledger read there; with `whole_gradients` (ZeRO-1, whose backward keeps every gradient whole until its end, as
    one GPU's does) the gradients stay in."""
    start, end = steady_start(ledger), ledger.marks.get(f"step{STEPS}.optimizer")
    if start is None or end is None or ledger.splits is None or ledger.events is None:
        raise ValueError("the simulated step recorded no steady forward and backward")
    sizes: dict[Any, int] = {}
    live, best = 0, Excess(0, 0)
    for i, (key, n) in enumerate(ledger.events[:end]):
        if key == EMPTY_CACHE or key == STREAM:
            continue
        if n == -1:
            live -= sizes.pop(key)
            continue
        sizes[key] = n
        live += n
        split = ledger.splits.get(i)
        if i >= start and split is not None:
            weights, gradients, optimizer, activations = split
            kept = gradients if whole_gradients else 0
            if live - weights - gradients - optimizer + kept > best.bytes:
                best = Excess(live - weights - gradients - optimizer + kept, activations, kept)
    return best


def rank_excess(config: dict[str, Any], layers: int, simulate: Callable[[int | None], TensorLedger],
                whole_gradients: bool = False) -> Excess:
    """The `Excess` of the model of `layers` decoder layers: from its cut models' simulated steps
    (`simulate(k)`, k layers) where the model's layers are alike and each layer adds the same bytes over
    `compose.CUTS`, else from `simulate(None)`, the whole model's."""
    if compose.composable(config, layers):
        cuts = at_once(lambda k: excess(simulate(k), whole_gradients), compose.CUTS)
        grows = [[getattr(b, f) - getattr(a, f) for a, b in zip(cuts, cuts[1:])]
                 for f in ("bytes", "activations", "gradients")]
        if all(g[0] == g[1] for g in grows):
            extra = layers - compose.CUTS[-1]
            return Excess(*(getattr(cuts[-1], f) + extra * g[1]
                            for f, g in zip(("bytes", "activations", "gradients"), grows)))
    return excess(simulate(None), whole_gradients)
