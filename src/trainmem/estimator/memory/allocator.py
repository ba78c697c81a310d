"""A replay of PyTorch's CUDA caching allocator, to predict `peak_reserved` from a sequence of allocations.

`torch.cuda.max_memory_reserved` is what decides an OOM, and it is not a fixed multiple of the allocated
peak: measured on the H200 it ranged from 1.02x to 1.29x across setups, depending on the sizes and the
order in which tensors come and go. This module applies the allocator's own policy
(c10/cuda/CUDACachingAllocator.cpp, default settings) to an ordered list of alloc/free events, such as the
simulate method's tensor ledger records:

- sizes round up to 512 bytes; requests up to 1 MiB use the small pool, larger ones the large pool;
- a request no cached block can hold reserves a new segment: 2 MiB for small requests, 20 MiB for
  requests under 10 MiB, otherwise the request rounded up to 2 MiB;
- the smallest cached block that holds the request is used (best fit, lowest address on ties) and split
  when the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool);
- a freed block merges with free neighbours in its segment and stays reserved;
- each stream has its own segments and free blocks: a block freed by one stream's tensor serves only that
  stream's later requests (FSDP2 allocates its all-gather buffers on a copy-in stream and its sharded gradients
  on a reduce-scatter stream; a `measure.STREAM` event switches the stream the next requests are made on);
- under a memory cap (`torch.cuda.set_per_process_memory_fraction`, what `--gpu NAME` sets), a segment
  that would cross the cap first releases every fully free segment and retries; if that still fails the
  request is an out-of-memory error.
`expandable_segments`, `max_split_size_mb` and `roundup_power2_divisions` are not modelled (all off by
default).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

MiB = 1024**2
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


def round_size(n: int) -> int:
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def segment_size(n: int) -> int:
    """Bytes one new segment reserves for a rounded request of `n` bytes."""
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-n // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False, slots=True)
class _Block:
    addr: int
    size: int
    small: bool
    segment: int
    stream: int = 0
    prev: _Block | None = None
    next: _Block | None = None
    free: bool = True


@dataclass
class AllocatorOOM(Exception):
    requested: int
    reserved: int
    cap: int

    def __str__(self) -> str:
        return f"tried to allocate {self.requested} bytes with {self.reserved} reserved under a cap of {self.cap}"


@dataclass
class CachingAllocator:
    """Segments, blocks and the two free pools of one device's caching allocator, with its statistics."""

    cap: int | None = None
    """Bytes the allocator may reserve (None: no cap)."""
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    stream: int = 0
    """The stream the next requests are made on (0: the default stream)."""
    _pools: dict[tuple[int, bool], list[tuple[int, int, _Block]]] = field(default_factory=dict)
    _live: dict[object, _Block] = field(default_factory=dict)
    _segments: dict[int, _Block] = field(default_factory=dict)
    _next_addr: int = 1 << 48

    def malloc(self, key: object, nbytes: int) -> None:
        """Allocate `nbytes` for `key` (a size-0 request takes no block, as in PyTorch). A replay makes hundreds of
        thousands of these: `round_size`, `_best_fit` and `_split` are written out here."""
        if nbytes <= 0:
            return
        size = MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        small = size <= SMALL_SIZE
        pool = self._pools.get((self.stream, small))
        i = bisect.bisect_left(pool, (size, -1)) if pool else 0
        block = pool.pop(i)[2] if pool and i < len(pool) else self._new_segment(small, size)
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = _Block(block.addr + size, rest, small, block.segment, block.stream, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._pool(tail)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated

    def free(self, key: object) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.free = True
        prev, nxt = block.prev, block.next
        if prev is not None and prev.free:
            self._unpool(prev)
            block = self._merge(block, prev)
        if nxt is not None and nxt.free:
            self._unpool(nxt)
            block = self._merge(block, nxt)
        self._pool(block)

    def empty_cache(self) -> None:
        """Release every fully free segment (`torch.cuda.empty_cache`, and the retry before an OOM)."""
        for seg, head in list(self._segments.items()):
            if head.free and head.next is None:
                self._unpool(head)
                del self._segments[seg]
                self.reserved -= head.size

    def layout(self) -> tuple[tuple[Any, ...], ...]:
        """Every segment, oldest first, as its stream and its blocks' (size, free) in address order: what
        decides where the next requests go (absolute addresses only order the segments)."""
        out = []
        for seg in sorted(self._segments, reverse=True):
            block: _Block | None = self._segments[seg]
            blocks: list[Any] = [self._segments[seg].stream]
            while block is not None:
                blocks.append((block.size, block.free))
                block = block.next
            out.append(tuple(blocks))
        return tuple(out)

    def reset_peak(self) -> None:
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    # --- policy ---------------------------------------------------------------------------------------
    def _new_segment(self, small: bool, size: int) -> _Block:
        seg = segment_size(size)
        if self.cap is not None and self.reserved + seg > self.cap:
            self.empty_cache()
            if self.reserved + seg > self.cap:
                raise AllocatorOOM(size, self.reserved, self.cap)
        # the driver hands out virtual addresses top-down (H200 traces), so a newer segment has a lower
        # address and wins the allocator's best-fit ties, which break on address
        self._next_addr -= seg
        block = _Block(self._next_addr, seg, small, self._next_addr, self.stream)
        self._segments[block.segment] = block
        self.reserved += seg
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _merge(self, block: _Block, other: _Block) -> _Block:
        first, second = (block, other) if block.addr < other.addr else (other, block)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _pool(self, block: _Block) -> None:
        bisect.insort(self._pools.setdefault((block.stream, block.small), []), (block.size, block.addr, block))

    def _unpool(self, block: _Block) -> None:
        pool = self._pools[(block.stream, block.small)]
        i = bisect.bisect_left(pool, (block.size, block.addr))
        assert pool[i][2] is block
        pool.pop(i)


def replay(events: Iterable[tuple[object, int]], cap: int | None = None,
           allocator: CachingAllocator | None = None) -> CachingAllocator:
    """Apply (key, bytes) events in order: bytes > 0 allocates for key, bytes < 0 frees key's block,
    the key `measure.EMPTY_CACHE` releases the cached free segments, the key `measure.STREAM` makes stream
    `bytes` the one later requests are made on. Raises AllocatorOOM where a capped allocator runs out."""
    from trainmem.measure.ledger import EMPTY_CACHE, STREAM

    a = allocator or CachingAllocator(cap=cap)
    malloc, free = a.malloc, a.free
    for key, n in events:
        if n < 0:
            free(key)
        elif key.__class__ is not str:
            malloc(key, n)
        elif key == STREAM:
            a.stream = n
        elif key == EMPTY_CACHE:
            a.empty_cache()
        else:
            malloc(key, n)
    return a


def live_peak(events: Iterable[tuple[object, int]]) -> int:
    """The most bytes `replay`'s events hold at once, as requested: any allocator's blocks hold at least that much,
    so no cap below it runs them."""
    return live_peak_at(events)[0]


def live_peak_at(events: Iterable[tuple[object, int]]) -> tuple[int, int]:
    """`live_peak`, and the index of the allocation that first reached it (as a ledger finds its peak: a new
    peak only above the last)."""
    from trainmem.measure.ledger import EMPTY_CACHE, STREAM

    sizes: dict[object, int] = {}
    live = peak = at = 0
    for i, (key, n) in enumerate(events):
        if key == EMPTY_CACHE or key == STREAM:
            continue
        if n < 0:
            live -= sizes.pop(key, 0)
        else:
            sizes[key] = n
            live += n
            if live > peak:
                peak, at = live, i
    return peak, at


SETTLE_STEPS = 16
"""Steps a replay repeats at most, after the simulated ones, waiting for the allocator's layout to settle."""


def replay_steps(events: Sequence[tuple[object, int]], steady: int | None, allocator: CachingAllocator) -> bool:
    """`replay` a simulation's steps into `allocator`, then its last step (from event `steady`, see
    `simulate.steady_start`) again until the layout settles (`repeat_until_settled`). False where it did
    not settle within `SETTLE_STEPS` or the step cannot be repeated. Raises AllocatorOOM as `replay` does."""
    replay(events, allocator=allocator)
    return steady is None or repeat_until_settled(allocator, events[steady:], SETTLE_STEPS) is not None


def repeat_until_settled(a: CachingAllocator, step: Sequence[tuple[object, int]], limit: int) -> int | None:
    """Replay one steady optimizer step's events again, each repetition under its own keys, until the
    allocator ends a step in a layout it ended an earlier one in: from there the sequence repeats steps
    already replayed, so the peaks so far are those of a run of any length. Near a cap the layout a step
    leaves decides the next one (segments released and carved again), and a run can fit three steps and
    run out in its fourth (a mistral-7b QLoRA run at 13k tokens emulating an A10G on the H200, docs/lab). Returns the
    repetitions replayed, None where `limit` came first or the step is not self-contained (it keeps
    something for the next one, which repeating under new keys would leak). Raises AllocatorOOM as
    `replay` does."""
    from trainmem.measure.ledger import EMPTY_CACHE, STREAM

    special = (EMPTY_CACHE, STREAM)
    allocs = {k for k, n in step if n > 0 and k not in special}
    if allocs - {k for k, n in step if n < 0}:
        return None
    seen = {a.layout()}
    for rep in range(1, limit + 1):
        replay((((k if k in special else (k, rep)), n) for k, n in step), allocator=a)
        state = a.layout()
        if state in seen:
            return rep
        seen.add(state)
    return None


def trace_events(trace: Sequence[Sequence[Any]]) -> Iterator[tuple[object, int]]:
    """A recorded CUDA allocator trace as `replay` events: `benchmarks/allocator_trace.py` keeps
    (action, address, size, stream, frames) per event of `torch.cuda.memory._snapshot()`. Each alloc and
    completed free, an `empty_cache` where a run of segments went back to the driver, and the request that
    ran out of memory (`oom`), after which the trace ends. Streams are numbered in the order they first
    allocate, the default stream 0."""
    from trainmem.measure.ledger import EMPTY_CACHE, STREAM

    streams: dict[int, int] = {0: 0}
    current = 0
    for i, (action, addr, size, *rest) in enumerate(trace):
        if action == "segment_free" and trace[i - 1][0] != "segment_free":
            yield EMPTY_CACHE, 0
        elif action == "alloc":
            stream = streams.setdefault(rest[0] if rest else 0, len(streams))
            if stream != current:
                current = stream
                yield STREAM, stream
            yield addr, size
        elif action == "free_completed":
            yield addr, -1
        elif action == "oom":
            yield "the request that ran out", size
            return


__all__ = ["CachingAllocator", "AllocatorOOM", "SETTLE_STEPS", "replay", "live_peak", "replay_steps",
           "repeat_until_settled", "trace_events", "round_size", "segment_size"]
