"""The simulate method for a DeepSpeed ZeRO-1 or ZeRO-2 rank (`--shard zero1|zero2`).

Stages 1 and 2 partition the optimizer states (and stage 2 the gradients) but keep every parameter whole
(DeepSpeed's `stage_1_and_2.py`): each rank runs the whole model's forward and backward on its own micro-batch,
exactly as one GPU does. So what the rank's forward and backward hold beyond its weights, gradients and
optimizer states is what the single-GPU step holds beyond them: the simulated step of the same model and micro-
batch gives it, and the rank's states come from DeepSpeed's partitioning (`sharding.rank_states`).

Without offload, the peak allocated and reserved bytes come from the allocator replay of the rank's own events
(`rank_events`), and the parts of the answer from what those events hold at the most allocated one (`peak_parts`).
The events are the single-GPU step's,
with DeepSpeed's engine in place of what differs. The engine copies the trainable weights into one flat buffer and
frees them (their blocks stay cached, and the forward's activations reuse them), makes the fp32 partition and a
zero gradient for it, and keeps one gradient bucket; each backward's gradients go through the bucket into the
rank's partition buffer; its step is DeepSpeed's (`optimizer_step`), the gradient norm's fp64 copies first.
Read in DeepSpeed 0.19.8's `stage_1_and_2.py` and in the allocator traces of fourteen measured ranks
(docs/lab/zero-reserved-2026-12-07.md). Under optimizer offload, whose engine is not replayed, a rank is its states
plus the single-GPU step's most bytes beyond them (`Excess`).

The optimizer step is DeepSpeed's (`StepPeak`): it takes the gradient norm in fp64, one gradient piece at a time,
then flattens the rank's gradient partition and casts it to fp32 while the gradients it was flattened from still
exist, then steps the wrapped optimizer on the fp32 partition.

A deep model of uniform layers is not simulated whole: its cut models' figures (`compose.CUTS` layers) grow by
the same bytes a layer, and are extended to the full depth; where they do not, the whole model is simulated.
"""

from __future__ import annotations

import dataclasses
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
    events: list[tuple[Any, int]] | None = dataclasses.field(default=None, compare=False)
    """The single-GPU step's events at the model's full depth (for `rank_events`); None where its cut models'
    steps do not compose."""
    marks: dict[str, int] | None = dataclasses.field(default=None, compare=False)
    """Where each phase of those events begins."""


@dataclass(frozen=True)
class StepPeak:
    """The most a ZeRO-1/2 rank's optimizer step holds beyond its weights and optimizer states, on the fullest rank:
    `gradients` (the gradient bytes then alive) and `other` (DeepSpeed's fp64, flat and fp32 copies of the
    partition and the wrapped optimizer's temporaries)."""

    gradients: int
    other: int
    moment: str
    """Which moment of the step: "norm" (the gradient norm, each gradient piece of the partition copied to fp64 in
    turn), "flatten" (the partition flattened and cast to fp32) or "update" (the wrapped optimizer's step on the
    fp32 partition)."""
    rank: int
    """The rank asked, else the fullest (the first of equals)."""


ALIGNMENT = 2
"""DeepSpeed pads the flat group of trainable parameters to a multiple of `nccl_start_alignment_factor` (2) times
the world size, so that each rank's partition is the same size (`stage_1_and_2.py`)."""

NORM_BYTES = 8
"""DeepSpeed's gradient norm copies each gradient piece of the rank's partition to fp64 (`get_norm_dtype`) before
its `vector_norm`, one piece at a time (`get_grad_norm_direct`, on by default: `compute_grad_norm`)."""


def partition_of(sizes: Sequence[int], world: int) -> tuple[int, list[int], list[int]]:
    """DeepSpeed's partition of a flat group of parameters of `sizes` elements over `world` ranks: the partition's
    elements, and for each rank the elements of the parameters that overlap its partition (whole) and its largest
    piece of one parameter (the part of a parameter inside its bounds)."""
    total = -(-sum(sizes) // (ALIGNMENT * world)) * ALIGNMENT * world
    part = total // world
    overlapping, largest = [0] * world, [0] * world
    if not part:
        return 0, overlapping, largest
    start = 0
    for n in sizes:
        if n:
            for r in range(start // part, (start + n - 1) // part + 1):
                overlapping[r] += n
                largest[r] = max(largest[r], min(start + n, (r + 1) * part) - max(start, r * part))
        start += n
    return part, overlapping, largest


def optimizer_step(sizes: Sequence[int], world: int, grad_bytes: int, foreach: bool,
                   rank: int | None = None) -> StepPeak:
    """DeepSpeed 0.19's ZeRO-1/2 `step()` without offload, for trainable parameters of `sizes` elements (in the
    order the optimizer holds them) whose gradients take `grad_bytes` bytes an element, over `world` ranks.

    A rank's gradients are those of every parameter that overlaps its partition, whole (the contiguous
    `grads_in_partition`; a ZeRO-1 rank has freed the others' by then). `step()` first takes the gradient norm
    (`norm`: each piece of a gradient inside the partition copied to fp64 in turn), then flattens the partition's
    slices of them (`flatten`: one more partition in their dtype) and casts that to fp32 (`.to`: a copy unless they
    are fp32 already) before it frees them; last, the wrapped optimizer steps the fp32 partition, foreach AdamW
    with one temporary as large. Of `rank` where given, else of the fullest rank, the one whose step holds the most
    (the first of equals): its partition's parameters reach furthest past its bounds, or one parameter fills most
    of it (docs/lab/zero-optimizer-step-2026-12-07.md)."""
    part, overlapping, largest = partition_of(sizes, world)
    if not part:  # nothing trainable: no gradients to flatten
        return StepPeak(0, 0, "flatten", 0)
    fp32 = 4 * part
    update = StepPeak(fp32, fp32 if foreach else 0, "update", 0)
    best = None
    for r in range(world) if rank is None else (rank,):
        norm = StepPeak(grad_bytes * overlapping[r], NORM_BYTES * largest[r], "norm", r)
        flatten = StepPeak(grad_bytes * overlapping[r], grad_bytes * part + (fp32 if grad_bytes != 4 else 0),
                           "flatten", r)
        peak = max(flatten, norm, dataclasses.replace(update, rank=r), key=lambda p: p.gradients + p.other)
        if best is None or peak.gradients + peak.other > best.gradients + best.other:
            best = peak
    assert best is not None
    return best


class _Reduction:
    """DeepSpeed's reduction of a rank's gradients through its contiguous bucket (`reduce_bucket_size` elements,
    `stage_1_and_2.py`): each gradient is copied into the bucket and its own block freed (one larger than the
    bucket waits for the reduction); a full bucket is reduced, and the first reduction that holds a parameter of
    the rank's partition [`low`, `high`) allocates the partition buffer (`held`, by `allocate`). With `keep_large`
    (ZeRO-1, whose reduction clears no gradient), the gradients larger than the bucket stay until the partition
    buffer exists, as the allocator traces of ZeRO-1 ranks show them (docs/lab/zero-reserved-2026-12-07.md)."""

    def __init__(self, bucket: int, low: int, high: int, allocate: Callable[[], Any], out: list[tuple[Any, int]],
                 keep_large: bool = False):
        self.bucket, self.low, self.high, self.allocate, self.out = bucket, low, high, allocate, out
        self.elements, self.starts, self.large = 0, [], []
        self.held: Any = None
        self.keep_large, self.kept = keep_large, []

    def arrive(self, key: Any, elements: int, start: int) -> None:
        if self.elements + elements > self.bucket:
            self.reduce()
        if elements > self.bucket:
            self.large.append(key)
        else:
            self.out.append((key, -1))
        self.starts.append((start, elements))
        self.elements += elements

    def reduce(self) -> None:
        if self.held is None and any(s < self.high and s + n > self.low for s, n in self.starts):
            self.held = self.allocate()
        if self.keep_large and self.held is None:
            self.kept += self.large
        else:
            self.out.extend((k, -1) for k in self.kept + self.large)
            self.kept = []
        self.elements, self.starts, self.large = 0, [], []

    def finish(self) -> None:
        """The backward's last bucket reduced, and any gradient still kept freed."""
        self.reduce()
        self.out.extend((k, -1) for k in self.kept)
        self.kept = []


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
        ledgers = at_once(lambda k: compose.Recorded.of(simulate(k)), compose.CUTS)
        cuts = [excess(ledger, whole_gradients) for ledger in ledgers]
        grows = [[getattr(b, f) - getattr(a, f) for a, b in zip(cuts, cuts[1:])]
                 for f in ("bytes", "activations", "gradients")]
        if all(g[0] == g[1] for g in grows):
            extra = layers - compose.CUTS[-1]
            step = compose.composed_step(config, layers, simulate, compose.CUTS[0], dict(zip(compose.CUTS, ledgers)))
            return Excess(*(getattr(cuts[-1], f) + extra * g[1]
                            for f, g in zip(("bytes", "activations", "gradients"), grows)),
                          events=step.events if step is not None else None,
                          marks=step.marks if step is not None else None)
    ledger = simulate(None)
    return dataclasses.replace(excess(ledger, whole_gradients), events=ledger.events, marks=dict(ledger.marks))


@dataclass
class RankEvents:
    """A ZeRO-1/2 rank's events (`rank_events`), with what the answer's breakdown reads of them."""

    events: list[tuple[Any, int]]
    steady: int | None
    """Where the last step begins (the replay repeats it)."""
    kinds: dict[Any, str]
    """The part ("weights", "gradients", "optimizer") of each block that holds a state; the others are the step's
    activations and temporaries."""
    phases: list[tuple[int, str]]
    """(index of its first event, name) of each phase: the build, then the single-GPU step's marks."""


def rank_events(found: Excess, shard: str, sizes: Sequence[int], grad_bytes: int, world: int, rank: int,
                bucket: int, foreach: bool) -> RankEvents | None:
    """The events of rank `rank` of a ZeRO-1/2 run without offload, from the single-GPU step's (`found.events`);
    None where there are none.

    `sizes`: the trainable parameters' elements in the optimizer's order, `grad_bytes` their bytes an element,
    `bucket`: the gradient bucket's elements (`reduce_bucket_size`). What DeepSpeed 0.19.8 does differently from
    one GPU, in order: after the model is built, the flat buffer of the trainable weights (padded to `ALIGNMENT`
    x `world`) and the weights freed (matched by size among the blocks the build left); the fp32 partition (a
    half clone first, cast); the zero gradient `initialize_optimizer_states` makes and drops; the gradient bucket.
    In each step: the forward as on one GPU; the backward's gradients go through the bucket (`_Reduction`) as
    they are made (ZeRO-2), or at the backward's end in the flat order (ZeRO-1, which keeps them whole until
    then), and the first reduction of a parameter of the partition allocates the rank's partition buffer (every
    parameter overlapping the partition, whole). The step replaces the one-GPU optimizer's: the norm's fp64 copy of
    the largest gradient piece, the flat gradient partition, its fp32 cast, the Adam moments of the partition
    (first step), the foreach temporary."""
    events, marks = found.events, found.marks
    if not events or not marks or "step1.micro1.forward" not in marks:
        return None
    part, overlaps, pieces = partition_of(sizes, world)
    if not part:
        return None
    total, overlapping, largest = part * world, overlaps[rank], pieces[rank]
    order = sorted(marks.items(), key=lambda kv: kv[1])
    spans = [(name, at, order[i + 1][1] if i + 1 < len(order) else len(events)) for i, (name, at) in enumerate(order)]
    first = marks["step1.micro1.forward"]
    built: dict[Any, int] = {}
    for key, n in events[:first]:
        if key in (EMPTY_CACHE, STREAM):
            continue
        if n == -1:
            built.pop(key, None)
        else:
            built[key] = n
    wanted: dict[int, int] = {}
    for n in sizes:
        wanted[n * grad_bytes] = wanted.get(n * grad_bytes, 0) + 1
    weights = []
    for key, n in built.items():
        if wanted.get(n, 0):
            wanted[n] -= 1
            weights.append(key)
    gradients: set[Any] = set()  # allocated in a step's backward and freed by its optimizer's zero_grad
    for name, a, b in spans:
        if name.endswith("optimizer"):
            step = name.split(".")[0]
            made = {k for s, c, d in spans if s.startswith(step + ".") and s.endswith("backward")
                    for k, n in events[c:d] if n > 0}
            gradients |= made & {k for k, n in events[a:b] if n == -1}
    out = list(events[:first])
    kinds = {key: "weights" for key in built}  # the build's blocks still held: weights and buffers
    count = iter(range(1, 1 << 62))

    def new(n: int, kind: str | None = None) -> Any:
        key = ("zero", next(count))
        out.append((key, n))
        if kind is not None:
            kinds[key] = kind
        return key

    phases = [(0, "build")]
    new(total * grad_bytes, "weights")
    out.extend((k, -1) for k in weights)
    if grad_bytes != 4:
        clone = new(grad_bytes * part)
        new(4 * part, "optimizer")
        out.append((clone, -1))
    else:
        new(4 * part, "optimizer")
    out.append((new(4 * part), -1))
    new(bucket * grad_bytes)
    low, high, used = rank * part, (rank + 1) * part, sum(sizes)
    walk = _Reduction(bucket, low, high, lambda: new(overlapping * grad_bytes, "gradients"), out,
                      keep_large=shard == "zero1")
    kinds.update((key, "gradients") for key in gradients)
    steady, moments = None, False
    for name, a, b in spans:
        if a < first:  # the build, copied above
            continue
        phases.append((len(out), name))
        if name == f"step{STEPS}.micro1.forward":
            steady = len(out)
        if name.endswith("backward"):
            # a backward makes the gradients from the last parameter to the first: the k-th ends where the
            # elements of those made before it begin, counted from the end of the flat order
            made, mine = 0, []
            for key, n in events[a:b]:
                if key not in gradients:
                    out.append((key, n))
                    continue
                if n == -1:  # freed by the reduction already
                    continue
                elements = n // grad_bytes
                made += elements
                mine.append((key, elements, used - made))
                out.append((key, n))
                if shard == "zero2":  # each gradient reduced as it is made
                    walk.arrive(key, elements, used - made)
            if shard == "zero1":  # at the backward's end, in the flat order
                for key, elements, start in reversed(mine):
                    walk.arrive(key, elements, start)
            walk.finish()
        elif name.endswith("optimizer"):
            if largest:
                out.append((new(NORM_BYTES * largest), -1))
            flat = new(grad_bytes * part)
            cast = new(4 * part) if grad_bytes != 4 else flat
            if cast is not flat:
                out.append((flat, -1))
            if walk.held is not None:
                out.append((walk.held, -1))
                walk.held = None
            if not moments:
                new(4 * part, "optimizer")
                new(4 * part, "optimizer")
                moments = True
            if foreach:
                out.append((new(4 * part), -1))
            out.append((cast, -1))
        else:
            out.extend(events[a:b])
    return RankEvents(out, steady, kinds, phases)


def peak_parts(made: RankEvents) -> tuple[dict[str, int], str]:
    """The bytes each part requested (weights, gradients, optimizer; the step's own blocks as "rest") at the rank's
    most allocated event, the one where the blocks, rounded as the allocator rounds them, hold the most; and the
    phase that event falls in."""
    from .allocator import round_size

    live = {"weights": 0, "gradients": 0, "optimizer": 0, "rest": 0}
    sizes: dict[Any, int] = {}
    best, at, total, most = dict(live), 0, 0, 0
    for i, (key, n) in enumerate(made.events):
        if key == EMPTY_CACHE or key == STREAM:
            continue
        kind = made.kinds.get(key, "rest")
        if n == -1:
            freed = sizes.pop(key)
            live[kind] -= freed
            total -= round_size(freed)
            continue
        sizes[key] = n
        live[kind] += n
        total += round_size(n)
        if total > most:
            best, at, most = dict(live), i, total
    phase = next(name for start, name in reversed(made.phases) if start <= at)
    return best, phase
