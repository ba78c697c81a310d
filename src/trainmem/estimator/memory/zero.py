"""The simulate method for a DeepSpeed ZeRO-1 or ZeRO-2 rank (`--shard zero1|zero2`).

Stages 1 and 2 partition the optimizer states (and stage 2 the gradients) but keep every parameter whole
(DeepSpeed's `stage_1_and_2.py`): each rank runs the whole model's forward and backward on its own micro-batch,
exactly as one GPU does. So what the rank's forward and backward hold beyond its weights, gradients and
optimizer states is what the single-GPU step holds beyond them: the simulated step of the same model and micro-
batch gives it, and the rank's states come from DeepSpeed's partitioning (`sharding.rank_states`). The reserved
bytes stay the analytic ratio: DeepSpeed's own buckets and partitions are not simulated.

A deep model of uniform layers is not simulated whole: its cut models' figures (`compose.CUTS` layers) grow by
the same bytes a layer, and are extended to the full depth; where they do not, the whole model is simulated.
"""

from __future__ import annotations

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
    states, and how many of them the forward saved for backward (activations) at that point."""

    bytes: int
    activations: int


def simulates(setup: TrainSetup) -> bool:
    """Which ZeRO setups this method prices: stages 1 and 2 without QLoRA (whose 4-bit build DeepSpeed does not
    partition) and without parameter offload (a ZeRO-3 feature)."""
    return setup.shard in SHARDS and setup.peft != "qlora" and setup.offload in ("none", "optimizer")


def single_gpu(setup: TrainSetup) -> TrainSetup:
    """The same micro-batches on one GPU: what a ZeRO-1/2 rank's forward and backward run (DeepSpeed's engine
    around trainmem's loop runs the loop's; TRL's runs its own loss head)."""
    return setup.replace(gpus=1, shard="none", offload="none", rank=None, nodes=1, gpus_per_node=None,
                         engine="loop" if setup.engine == "deepspeed" else setup.engine)


def excess(ledger: TensorLedger) -> Excess:
    """The steady step's most bytes beyond the states (`Excess`), from a ledger recorded with `splits`: the live
    bytes at each allocation of its forwards and backwards, less the weights, gradients and optimizer states the
    ledger read there."""
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
            if live - weights - gradients - optimizer > best.bytes:
                best = Excess(live - weights - gradients - optimizer, activations)
    return best


def rank_excess(config: dict[str, Any], layers: int, simulate: Callable[[int | None], TensorLedger]) -> Excess:
    """The `Excess` of the model of `layers` decoder layers: from its cut models' simulated steps
    (`simulate(k)`, k layers) where the model's layers are alike and each layer adds the same bytes over
    `compose.CUTS`, else from `simulate(None)`, the whole model's."""
    if compose.composable(config, layers):
        cuts = at_once(lambda k: excess(simulate(k)), compose.CUTS)
        grow = [b.bytes - a.bytes for a, b in zip(cuts, cuts[1:])]
        saved = [b.activations - a.activations for a, b in zip(cuts, cuts[1:])]
        if grow[0] == grow[1] and saved[0] == saved[1]:
            extra = layers - compose.CUTS[-1]
            return Excess(cuts[-1].bytes + extra * grow[1], cuts[-1].activations + extra * saved[1])
    return excess(simulate(None))
