"""A recorded allocator trace cut into windows, one per training step, and replayed: each step's peaks.

`benchmarks/allocator_trace.py`'s traces hold every step of a run: the first two probed by trainmem's tensor
ledger (a Python dispatch mode), the rest run as a user's would, without it. The real alloc/free sequence is
replayed through `trainmem.estimator.memory.allocator` (which reproduces the measured `peak_reserved` from it)
and cut into windows at every PER_STEP-th request of MIB MiB: a tensor allocated a fixed number of times per
step, such as the logits. Where the windows' peaks differ after the probed steps, the run without the ledger
allocates differently (docs/lab/estimate-validation.md).

Example: `print_windows("docs/lab/data/trace-held-out-14-x0-held-out-12-w6-h200-2026-12-05.json.gz", "w6", 2048,
1)`, Gemma 3's 2 GiB logits once a step (`benchmarks/trace_steps.py` is its command line).
Limitation: a request within 1 MiB of MIB marks a step, so MIB must be a size nothing else of the step asks for;
the peaks before the first mark count in the first window.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable

from trainmem.estimator.memory.allocator import CachingAllocator, replay, trace_events

GiB, MiB = 2**30, 2**20


def windows(events: Iterable[tuple[object, int]], mib: float, per_step: int) -> list[tuple[int, int, int]]:
    """(window, peak allocated, peak reserved) in bytes of each window of replayed `events` (`replay`'s (key,
    bytes) events): a window starts at every `per_step`-th request of `mib` MiB (within 1 MiB); the last one
    runs to the end of the trace."""
    a, seen, window, out = CachingAllocator(), 0, 0, []
    for key, n in events:
        if n > 0 and abs(n - mib * MiB) < MiB:
            if seen % per_step == 0 and window:
                out.append((window, a.peak_allocated, a.peak_reserved))
                a.reset_peak()
            window += seen % per_step == 0
            seen += 1
        replay([(key, n)], allocator=a)
    out.append((window, a.peak_allocated, a.peak_reserved))
    return out


def print_windows(path: str, index: str, mib: float, per_step: int) -> int:
    """Print each window's peaks of the trace of row `index` in the gzipped JSON file `path` (`{"traces":
    [{"index", "arch", "setup", "events"}, ...]}`, as allocator_trace.py writes it). Returns 0, the command's
    exit status."""
    for t in json.load(gzip.open(path, "rt"))["traces"]:
        if t["index"] != index:
            continue
        print(f"{t['index']} {t['arch']} {t['setup']}")
        found = windows(trace_events(t["events"]), mib, per_step)
        for i, (window, allocated, reserved) in enumerate(found):
            end = " (to the end)" if i == len(found) - 1 else ""
            print(f"  window {window}{end}: peak allocated {allocated / GiB:.3f} GiB, "
                  f"reserved {reserved / GiB:.3f} GiB")
    return 0
