"""tokens/s of `trainmem run` against a bare training loop over the same model and data.

    python benchmarks/overhead.py OUT_DIR [--model polyglot-ko-1.3b --batch-size 4 --steps 12]

The bare loop is the seed's: forward, loss.backward(), AdamW step, zero_grad, no probes. Both run in
fresh processes on the same GPU; each reports tokens/s over the steps after two warm-up steps.
Writes OUT_DIR/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import trainmem
from trainmem.measure.build import build_model
from trainmem.measure.data import dummy_dataset, micro_batches


def bare(model_name: str, batch_size: int, steps: int, precision: str) -> float:
    spec = trainmem.ModelSpec.resolve(model_name)
    setup = trainmem.TrainSetup(batch_size=batch_size, precision=precision)
    model = build_model(spec, setup, "cuda", precision)
    opt = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    batches = micro_batches(dummy_dataset(setup.num_samples, setup.seq_len, spec.vocab_size), batch_size)
    times, tokens = [], []
    for step in range(steps):
        batch = {k: v.to("cuda") for k, v in batches[step % len(batches)].items()}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(batch["input_ids"].numel())
    return sum(tokens[2:]) / sum(times[2:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="polyglot-ko-1.3b")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare:
        print(json.dumps({"tokens_per_s": bare(args.model, args.batch_size, args.steps, args.precision)}))
        return 0
    out = {}
    for _ in range(args.repeats):  # alternate the two to spread any drift of clocks or temperature
        proc = subprocess.run([sys.executable, __file__, args.out, "--bare", "--model", args.model,
                               "--batch-size", str(args.batch_size), "--steps", str(args.steps),
                               "--precision", args.precision], capture_output=True, text=True, check=True)
        out.setdefault("bare", []).append(json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"])
        r = trainmem.run(trainmem.ModelSpec.resolve(args.model),
                         trainmem.TrainSetup(batch_size=args.batch_size, steps=args.steps, precision=args.precision))
        out.setdefault("trainmem", []).append(r.throughput["tokens_per_s"])
    import statistics

    out.update(model=args.model, batch_size=args.batch_size, steps=args.steps, precision=args.precision,
               ratio_of_medians=statistics.median(out["trainmem"]) / statistics.median(out["bare"]),
               ratio_of_best=max(out["trainmem"]) / max(out["bare"]), env=r.env)
    print(json.dumps(out, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overhead.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
