"""The chapter's batch-4 run through transformers.Trainer (with MemoryCallback) and through trainmem's loop.

    python benchmarks/trainer_vs_loop.py OUT_DIR

Both isolated (`trainmem.run`), polyglot-ko-1.3b fp16 weights, batch 4 x 256, torch AdamW, 3 steps.
Writes OUT_DIR/trainer-vs-loop.jsonl and prints a markdown table.
"""

from __future__ import annotations

import os
import sys

import trainmem

GiB = 2**30


def main(out: str) -> int:
    os.makedirs(out, exist_ok=True)
    spec = trainmem.ModelSpec.resolve("polyglot-ko-1.3b")
    rows = []
    for engine in ("loop", "trainer"):
        setup = trainmem.TrainSetup(batch_size=4, seq_len=256, precision="fp16", optimizer="adamw", steps=3,
                                    engine=engine)
        r = trainmem.run(spec, setup)
        r.append_to(os.path.join(out, "trainer-vs-loop.jsonl"))
        rows.append(r)
        if r.status != "ok":
            print(r.error or r.oom, file=sys.stderr)
    print("| engine | status | peak allocated | peak phase | weights | gradients | optimizer | at first step | peak reserved | device used |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        first = next((p["allocated"] for p in r.phases if p["phase"] == "step1.optimizer"), 0)
        m, ms = r.memory, r.model_states
        print(f"| {r.setup['engine']} | {r.status} | {m['peak_allocated'] / GiB:.3f} | {r.peak_phase} | "
              f"{ms['weights'] / GiB:.3f} | {ms['gradients'] / GiB:.3f} | {ms['optimizer'] / GiB:.3f} | "
              f"{first / GiB:.3f} | {m['peak_reserved'] / GiB:.3f} | {m['device_used'] / GiB:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
