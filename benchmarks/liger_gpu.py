"""`--kernels liger` against measured runs: Llama-3.1-8B and Qwen2.5-7B at sequence 4096, with Liger's kernels
and without, LoRA in bf16 and a full fine-tune that fits an 80 GB H100 (bf16 weights, Adafactor's factored
states, checkpointing). The setups were committed with the estimator's Liger stand-ins, before any of them ran
on a GPU: a held-out set.

    python benchmarks/liger_gpu.py OUT_DIR [INDEX ...]  # on the GPU: each setup in its own process (`trainmem run`)
    python benchmarks/liger_gpu.py estimate OUT_DIR     # anywhere: the estimates of the same setups
    python benchmarks/liger_gpu.py compare OUT_DIR      # anywhere: estimate vs measured, with % errors

On the GPU, liger-kernel comes from the wheel in .whl/ (Triton is in CUDA builds of torch):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/liger_kernel-*.whl
    PYTHONPATH=/tmp/site:$PWD/src:$PWD python3 benchmarks/liger_gpu.py OUT_DIR

Rows go to OUT_DIR/liger-measured.jsonl (measured) and OUT_DIR/liger-estimates.jsonl (estimated).

Why the full fine-tunes fit: 8.03e9 (Llama) or 7.62e9 (Qwen) parameters hold 2 bytes of weights and 2 of
gradients each, 32.1 or 30.5 GB; Adafactor keeps a row and a column of each matrix (well under 0.1 GB); with
checkpointing a layer keeps its 4096 x hidden input (32 MiB or 28 MiB, 32 or 28 layers) and one layer is
recomputed at a time; without Liger the loss adds the logits, (4096 x 128256 or 152064) in bf16 and their fp32
upcast, about 3.1 or 3.7 GB, and cross-entropy's fp32 log-probabilities as much again: under 45 GB of 80.
"""

from __future__ import annotations

import json
import os
import sys
import time

SEQ = 4096
LORA = dict(peft="lora", precision="bf16", batch_size=1, seq_len=SEQ)
FULL = dict(peft="none", precision="bf16", optimizer="adafactor", checkpointing=True, batch_size=1, seq_len=SEQ)
SETUPS: list[tuple[str, dict]] = [
    (model, dict(base, kernels=kernels))
    for model in ("llama-3.1-8b", "qwen2.5-7b")
    for base in (LORA, FULL)
    for kernels in ("none", "liger")
]
"""8 setups: each model's LoRA and full fine-tune, each without and with Liger's kernels."""
STEPS = 6


def measure(out_dir: str, indices: list[int]) -> int:
    import trainmem

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "liger-measured.jsonl")
    for i in indices or range(len(SETUPS)):
        model, kw = SETUPS[i]
        t0 = time.time()
        r = trainmem.run(model, trainmem.TrainSetup(steps=STEPS, **kw), timeout=540)
        r.append_to(path)
        print(f"[{i}] {model} {kw} {r.status} peak_allocated={r.memory['peak_allocated'] / 2**30:.3f} GiB "
              f"peak_reserved={r.memory['peak_reserved'] / 2**30:.3f} GiB ({time.time() - t0:.0f}s)", flush=True)
        if r.status == "error":
            print(r.error, file=sys.stderr)
    return 0


def estimates(out_dir: str) -> int:
    from trainmem import ModelSpec, TrainSetup
    from trainmem.estimator import estimate

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "liger-estimates.jsonl"), "w") as f:
        for i, (model, kw) in enumerate(SETUPS):
            t0 = time.time()
            b = estimate(ModelSpec.resolve(model), TrainSetup(steps=STEPS, **kw))
            row = {"index": i, "model": model, "setup": kw, "memory": b.memory, "notes": list(b.notes)}
            f.write(json.dumps(row) + "\n")
            print(f"[{i}] {model} {kw}: peak_allocated {b.memory['peak_allocated'] / 2**30:.2f} GiB, "
                  f"peak_reserved {b.memory['peak_reserved'] / 2**30:.2f} GiB ({time.time() - t0:.0f}s)", flush=True)
    return 0


def compare(out_dir: str) -> int:
    """Each measured row beside its estimate (from liger-estimates.jsonl where it is there, else computed now)."""
    measured = [json.loads(line) for line in open(os.path.join(out_dir, "liger-measured.jsonl"))]
    path = os.path.join(out_dir, "liger-estimates.jsonl")
    if not os.path.exists(path):
        estimates(out_dir)
    est = {(r["model"], json.dumps(r["setup"], sort_keys=True)): r for r in map(json.loads, open(path))}
    keys = ("peak_allocated", "peak_reserved")
    print(f"{'model':14} {'setup':34} " + " ".join(f"{k + ' est/meas GiB (err)':>34}" for k in keys))
    worst = 0.0
    for m in measured:
        model = m["model"]["name"]
        kw = next(kw for name, kw in SETUPS if name == model and all(m["setup"].get(k) == v for k, v in kw.items()))
        e = est[(model, json.dumps(kw, sort_keys=True))]
        label = f"{kw['peft']} {kw['kernels']}" + (" ckpt" if kw.get("checkpointing") else "")
        cells = []
        for k in keys:
            got, want = e["memory"][k], m["memory"][k]
            err = (got - want) / want * 100 if want else float("nan")
            worst = max(worst, abs(err)) if m["status"] == "ok" else worst
            cells.append(f"{got / 2**30:9.2f} / {want / 2**30:9.2f} ({err:+6.1f}%)")
        print(f"{model:14} {label:34} " + " ".join(f"{c:>34}" for c in cells) + f"  {m['status']}")
    print(f"largest |error| over ok rows: {worst:.1f}%")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "estimate":
        sys.exit(estimates(sys.argv[2]))
    if sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2]))
    sys.exit(measure(sys.argv[1], [int(a) for a in sys.argv[2:]]))
