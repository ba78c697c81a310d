"""Peak allocated and reserved per training step of a recorded allocator trace, replayed.

    python benchmarks/trace_steps.py TRACES.json.gz INDEX MIB PER_STEP   # anywhere: no GPU needed

`allocator_trace.py`'s traces hold every step of a run: the first two probed by trainmem's tensor ledger (a
Python dispatch mode), the rest run as a user's would, without it. The real alloc/free sequence is replayed
through `trainmem.estimator.memory.allocator` (which reproduces the measured `peak_reserved` from it) and cut into
windows at every PER_STEP-th request of MIB MiB in the trace of row INDEX (`w3`): a tensor allocated a fixed
number of times per step, such as the logits. Each window's peaks are printed: where they differ after the probed
steps, the run without the ledger allocates differently (held-out 12, docs/lab/estimate-validation.md).
"""

from __future__ import annotations

import gzip
import json
import sys

from trainmem.estimator.memory.allocator import CachingAllocator, replay, trace_events

GiB = 2**30


def main(path: str, index: str, mib: float, per_step: int) -> int:
    for t in json.load(gzip.open(path, "rt"))["traces"]:
        if t["index"] != index:
            continue
        print(f"{t['index']} {t['arch']} {t['setup']}")
        a, seen, window = CachingAllocator(), 0, 0
        for key, n in trace_events(t["events"]):
            if n > 0 and abs(n - mib * 2**20) < 2**20:
                if seen % per_step == 0 and window:
                    print(f"  window {window}: peak allocated {a.peak_allocated / GiB:.3f} GiB, "
                          f"reserved {a.peak_reserved / GiB:.3f} GiB")
                    a.reset_peak()
                window += seen % per_step == 0
                seen += 1
            replay([(key, n)], allocator=a)
        print(f"  window {window} (to the end): peak allocated {a.peak_allocated / GiB:.3f} GiB, "
              f"reserved {a.peak_reserved / GiB:.3f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
