"""Record the CUDA caching allocator's own event trace for some validation setups.

    python benchmarks/allocator_trace.py OUT_DIR [INDEX ...]    # on the GPU: OUT_DIR/traces.json.gz

Each setup (an index into validate.SETUPS, hN for validate.HELD_OUT[N], gN for validate.HELD_OUT_2[N],
kN for validate.HELD_OUT_4[N], sN for validate.HELD_OUT_6[N], tN for validate.HELD_OUT_7[N], uN for
validate.HELD_OUT_8[N], wN for validate.HELD_OUT_12[N], xN for validate.HELD_OUT_14[N], yN for validate.HELD_OUT_15[N], eN for validate.MOE_EXPLORE[N], fN for validate.SHARDED[N] (an FSDP2 rank), rN for sharded_ranks_gpu.RANKS[N] (a meta-built FSDP2 rank), l0/l1 for llama-3.2-1b LoRA b4 with/without `--kernels liger`,
zN for a DeepSpeed ZeRO rank of zero_ranks_gpu's sets 3 and 4 (z0-z9 set 3, z10-z19 set 4), vN of its
sets 1 and 2 (v0-v9, v10-v19), nN of its set 5, oN of its set 6, pN of its set 7,
cN for the chapter's run N
on a T4; under its `gpu` emulation where it names one) runs as in validate.py (STEPS=6 for the six steps of the
held-out sets from held-out 4 on; default 3), under `torch.cuda.memory._record_memory_history`; the trace
keeps, per event, its action (alloc, free_completed, segment_alloc, ...), size and address. The estimator's
allocator replay (trainmem.estimator.memory.allocator) is checked against these: replaying the real alloc/free sequence
must give the real segments, and the simulated sequence should come close to it. Allocations of 1 MiB or more keep
their three innermost Python frames.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import sys
import time

from validate import (
    HELD_OUT,
    HELD_OUT_2,
    HELD_OUT_4,
    HELD_OUT_6,
    HELD_OUT_7,
    HELD_OUT_8,
    HELD_OUT_12,
    HELD_OUT_14,
    HELD_OUT_15,
    MODELS,
    MOE_EXPLORE,
    SETUPS,
    SHARDED,
)

import sharded_ranks_gpu
import zero_ranks_gpu

from trainmem.config.chapter import RUNS

DEFAULT = [0, 1, 3, 6, 7, 14, 22, 26, 35]
CHAPTER_T4 = [("neox", {**run.setup.to_dict(), "gpu": "T4"}) for run in RUNS]
"""The chapter's seven runs emulating its T4 (`cN`)."""
SETS = {"h": HELD_OUT, "g": HELD_OUT_2, "k": HELD_OUT_4, "s": HELD_OUT_6, "t": HELD_OUT_7, "u": HELD_OUT_8,
        "w": HELD_OUT_12, "x": HELD_OUT_14, "y": HELD_OUT_15, "e": MOE_EXPLORE, "c": CHAPTER_T4,
        "f": [(a, dict(kw, shard="fsdp", device="cuda")) for a, kw in SHARDED],
        "r": [(a, dict(kw, shard="fsdp", device="cuda")) for a, kw in sharded_ranks_gpu.RANKS],
        "l": [("llama", dict(peft="lora", precision="bf16", batch_size=4, seq_len=1024, kernels=k))
              for k in ("liger", "none")],
        "z": [(a, dict(kw, engine="deepspeed", device="cuda")) for a, kw in zero_ranks_gpu.RANKS_3 + zero_ranks_gpu.RANKS_4],
        "v": [(a, dict(kw, engine="deepspeed", device="cuda")) for a, kw in zero_ranks_gpu.RANKS + zero_ranks_gpu.RANKS_2],
        "n": [(a, dict(kw, engine="deepspeed", device="cuda")) for a, kw in zero_ranks_gpu.RANKS_5],
        "o": [(a, dict(kw, engine="deepspeed", device="cuda")) for a, kw in zero_ranks_gpu.RANKS_6],
        "p": [(a, dict(kw, engine="deepspeed", device="cuda")) for a, kw in zero_ranks_gpu.RANKS_7]}
"""The sets a trace's index names by its letter (a bare number: `validate.SETUPS`)."""


def _where(event: dict) -> str:
    """The innermost Python frames of an allocation of 1 MiB or more (to tell which operator made it)."""
    if event["action"] != "alloc" or event["size"] < 2**20:
        return ""
    frames = [f for f in event.get("frames", []) if f.get("filename", "").endswith(".py")][:3]
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames)


def main(out_dir: str, indices: list[str]) -> int:
    import torch

    import trainmem
    from trainmem.isolation.engines import execute

    os.makedirs(out_dir, exist_ok=True)
    traces = []
    steps = int(os.environ.get("STEPS", 3))
    for i in indices:
        arch, kw = SETS[i[0]][int(i[1:])] if i[0] in SETS else SETUPS[int(i)]
        gc.collect()
        torch.cuda.empty_cache()
        t0 = time.time()
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=3_000_000)
        start = torch.cuda.memory._snapshot()["segments"]
        r = execute(trainmem.ModelSpec.resolve(MODELS.get(arch, arch)), trainmem.TrainSetup(**{"steps": steps, **kw}))
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = [(e["action"], e.get("addr", 0), e["size"], e.get("stream", 0), _where(e)) for e in snap["device_traces"][0]]
        traces.append({"index": i, "arch": arch, "setup": kw, "status": r.status, "memory": r.memory,
                       "start_segments": [(s["address"], s["total_size"], s["segment_type"],
                                           [(b["size"], b["state"]) for b in s["blocks"]]) for s in start],
                       "events": events})
        print(f"{i} {arch} {kw} {r.status} events={len(events)} reserved={r.memory['peak_reserved'] / 2**30:.3f} GiB "
              f"({time.time() - t0:.0f}s)", flush=True)
        with gzip.open(os.path.join(out_dir, "traces.json.gz"), "wt") as f:
            json.dump({"torch": torch.__version__, "traces": traces}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:] or [str(i) for i in DEFAULT]))
