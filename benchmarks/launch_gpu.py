"""`trainmem run --launch` on several GPUs: every rank under torchrun over NCCL, against the emulated rank (the fake
group on one GPU, the path the 19 sharded ranks of lab/sharding.md measured) and the estimate of the same setup.
The setups were chosen before any launched run was measured.

    python benchmarks/launch_gpu.py OUT_DIR [INDEX ...]   # on a machine with 4 GPUs (2-GPU setups run on 2 of them)

Each setup runs three ways: launched (N processes, NCCL), emulated (rank 0 under the fake group, one GPU) and
estimated (simulate for FSDP, analytic for DDP). Rows go to OUT_DIR/launch-measured.jsonl (launched, one merged
row each), OUT_DIR/launch-emulated.jsonl and OUT_DIR/launch-estimates.jsonl; the table prints each launched rank's
peak_allocated and peak_reserved against the estimate and the emulated rank, with % errors.
"""

from __future__ import annotations

import os
import sys
import time

SETUPS: list[tuple[str, dict]] = [
    ("llama-3.2-1b", dict(gpus=2, shard="fsdp", precision="amp-bf16", batch_size=2, seq_len=1024)),
    ("llama-3.2-1b", dict(gpus=4, shard="fsdp", precision="amp-bf16", batch_size=2, seq_len=1024)),
    ("qwen2.5-0.5b", dict(gpus=4, shard="fsdp", precision="bf16", batch_size=4, seq_len=512, checkpointing=True)),
    ("llama-3.2-1b", dict(gpus=2, shard="fsdp", precision="bf16", batch_size=2, seq_len=1024, peft="lora")),
    ("qwen2.5-0.5b", dict(gpus=2, shard="ddp", precision="bf16", batch_size=2, seq_len=1024)),
]
"""FSDP2 full fine-tuning at world 2 and 4, with checkpointing, LoRA; one DDP run."""
STEPS = 4


def _pct(est: float, got: float) -> str:
    return f"{100 * (est - got) / got:+.2f}%" if got else "-"


def main(out_dir: str, indices: list[int]) -> int:
    import trainmem
    from trainmem.estimator import estimate
    from trainmem.isolation.launch import launch

    os.makedirs(out_dir, exist_ok=True)
    gib = 2**30
    for i in indices or range(len(SETUPS)):
        model, kw = SETUPS[i]
        setup = trainmem.TrainSetup(device="cuda", steps=STEPS, **kw)
        t0 = time.time()
        launched = launch(trainmem.ModelSpec.resolve(model), setup, timeout=540)
        launched.append_to(os.path.join(out_dir, "launch-measured.jsonl"))
        emulated = trainmem.run(model, setup.replace(rank=0), timeout=540) if kw["shard"] == "fsdp" else None
        if emulated is not None:
            emulated.append_to(os.path.join(out_dir, "launch-emulated.jsonl"))
        est = estimate(model, setup)
        est.to_result().append_to(os.path.join(out_dir, "launch-estimates.jsonl"))
        print(f"[{i}] {model} {kw}: {launched.status} ({time.time() - t0:.0f}s); estimate {est.method} "
              f"{est.memory['peak_allocated'] / gib:.3f} GiB allocated, "
              f"{est.memory['peak_reserved'] / gib:.3f} reserved",
              flush=True)
        if launched.status == "error":
            print(launched.error, file=sys.stderr)
            continue
        for k in launched.ranks:
            m = k["memory"]
            line = (f"    rank {k['rank']}: {k['status']} allocated {m['peak_allocated'] / gib:.3f} GiB (estimate "
                    f"{_pct(est.memory['peak_allocated'], m['peak_allocated'])}), reserved "
                    f"{m['peak_reserved'] / gib:.3f} GiB (estimate "
                    f"{_pct(est.memory['peak_reserved'], m['peak_reserved'])})"
                    f", device_used {m['device_used'] / gib:.3f} GiB")
            if emulated is not None and emulated.status == "ok":
                e = emulated.memory
                line += (f"; emulated rank 0 allocated {_pct(e['peak_allocated'], m['peak_allocated'])}, "
                         f"reserved {_pct(e['peak_reserved'], m['peak_reserved'])}")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], [int(a) for a in sys.argv[2:]]))
