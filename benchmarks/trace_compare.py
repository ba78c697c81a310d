"""Where a traced run and its simulation run out of memory, replayed under the same allocator cap.

    python benchmarks/trace_compare.py TRACES.json.gz [INDEX ...]   # anywhere: no GPU needed

For each trace of `allocator_trace.py` (validate.py's held-out rows sN, tN, uN, wN, xN), two replays through
`trainmem.estimator.memory.allocator` under the row's cap: the real alloc/free sequence (with `empty_cache` where the
driver got segments back), and the simulate method's own ledger for the same setup, replayed as the estimate
does (its last step repeated until the allocator settles). Each ends at its first
out-of-memory request or runs to the end; printed side by side with the measured outcome, they show whether a
wrong verdict comes from the simulated sequence or from the allocator replay. Only a trace recorded first in its
process starts, as the simulation does, from an empty allocator.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Sequence

from allocator_trace import SETS
from validate import MODELS

import trainmem
from trainmem.estimator.memory.allocator import (
    AllocatorOOM,
    CachingAllocator,
    replay_steps,
    trace_events,
)
from trainmem.estimator.memory.simulate import (
    model_builder,
    simulate_step,
    steady_start,
)
from trainmem.hardware.gpus import CATALOG, find_gpu

GiB = 2**30


def _outcome(a: CachingAllocator, failed: int | None) -> str:
    if failed is None:
        return f"runs, peak reserved {a.peak_reserved / GiB:.3f} GiB"
    return f"out of memory at a {failed / 2**20:.1f} MiB request, {a.allocated / GiB:.3f} GiB allocated, " \
           f"{a.reserved / GiB:.3f} reserved"


def real(trace: dict, cap: int | None) -> str:
    return _replayed(list(trace_events(trace["events"])), None, cap)


def simulated(spec: trainmem.ModelSpec, setup: trainmem.TrainSetup, precision: str, cap: int | None) -> str:
    card = find_gpu(setup.gpu) if setup.gpu else CATALOG["H200"]  # uncapped rows ran on the H200
    ledger, _ = simulate_step(model_builder(spec, setup, precision, card), setup, precision,
                              workspace=card.cublas_workspace, flash=card.flash)
    return _replayed(ledger.events, steady_start(ledger), cap)


def _replayed(events: Sequence[tuple[object, int]], steady: int | None, cap: int | None) -> str:
    """Replayed as the estimate replays (`replay_steps`): a simulation's last step repeated until settled."""
    a = CachingAllocator(cap=cap)
    try:
        replay_steps(events, steady, a)
    except AllocatorOOM as e:
        return _outcome(a, e.requested)
    return _outcome(a, None)


def main(path: str, indices: list[str]) -> int:
    for t in json.load(gzip.open(path, "rt"))["traces"]:
        if indices and t["index"] not in indices:
            continue
        arch, kw = SETS[t["index"][0]][int(t["index"][1:])]
        spec = trainmem.ModelSpec.resolve(MODELS[arch])
        setup = trainmem.TrainSetup(**{"steps": 3, **kw}).resolved(spec)
        cap = setup.cap_bytes(kw["precision"])
        print(f"{t['index']} {spec.name} {kw} measured: {t['status']}\n"
              f"  real sequence:      {real(t, cap)}\n"
              f"  simulated sequence: {simulated(spec, setup, kw['precision'], cap)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
