"""The chapter's model at the T4's boundary, batch by batch: the estimate's verdict beside a run under the T4's
cap (`--gpu T4` on a bigger GPU), to check max-batch's answer where memory is not monotone in batch.

    python benchmarks/boundary_gpu.py OUT_DIR      # on a CUDA GPU: OUT_DIR/boundary-t4.jsonl

polyglot-ko-1.3b in fp16 at the chapter's 256 tokens, batches 4 to 10, each estimated (simulate, the T4's
runtime) and run in a fresh `trainmem run` process under the T4's cap. A `fits` verdict must run, `no` must run
out of memory; `tight` (within the card, less than the 2% margin free) may go either way. Chosen before any ran.
"""

from __future__ import annotations

import json
import os
import sys

BATCHES = range(4, 11)


def main(out_dir: str) -> int:
    from trainmem import TrainSetup, estimate, run

    os.makedirs(out_dir, exist_ok=True)
    wrong = 0
    for b in BATCHES:
        setup = TrainSetup(precision="fp16", batch_size=b, seq_len=256, gpu="T4")
        v = estimate("polyglot-ko-1.3b", setup).verdict("T4")
        r = run("polyglot-ko-1.3b", setup.replace(device="cuda"))
        bad = (v["level"] == "fits" and r.status != "ok") or (v["level"] == "no" and r.status != "oom")
        wrong += bad
        row = {"batch": b, "level": v["level"], "need": v["need"], "status": r.status,
               "peak_reserved": (r.memory or {}).get("peak_reserved"), "right": not bad, "env": r.env}
        with open(os.path.join(out_dir, "boundary-t4.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"batch {b}: estimate {v['level']} (needs {v['need'] / 2**30:.3f} GiB), run {r.status}"
              f"{'' if not bad else '  WRONG'}", flush=True)
    print(f"{len(BATCHES) - wrong} of {len(BATCHES)} verdicts right")
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
