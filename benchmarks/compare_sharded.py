"""Sharded estimates against one emulated FSDP2 rank measured on one GPU (docs/lab/sharding.md, issue 17).

    python benchmarks/compare_sharded.py docs/lab/data/validation-sharded-h200-2026-12-03.jsonl [--out FILE.md]

For each measured rank (benchmarks/validate.py sharded): the analytic closed form and the simulated FSDP2
step (rank 0 under the fake process group, estimator/sharded.py) against the rank's
`torch.cuda.max_memory_allocated`, and the simulated rank's states against the measured ones.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import trainmem
from trainmem.estimator import estimate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_estimates import cli, emit  # noqa: E402

GiB = 2**30


def main(path: str, out: str | None) -> int:
    lines = ["| model | setup (rank) | measured peak GiB | analytic | simulate | simulate reserved | states (w/g/o) simulate - measured MiB | simulate s |",
             "|---|---|---|---|---|---|---|---|"]
    errs: dict[str, list[float]] = {"analytic": [], "simulate": [], "reserved": []}
    for line in open(path):
        r = json.loads(line)
        s = trainmem.TrainSetup.from_dict(r["setup"])
        spec = trainmem.ModelSpec.resolve(r["model"]["name"])
        meas, res = r["memory"]["peak_allocated"], {}
        t = 0.0
        for method in ("analytic", "simulate"):
            t0 = time.perf_counter()
            res[method] = estimate(spec, s.replace(rank=None), method)
            t = time.perf_counter() - t0
        a, m = res["analytic"], res["simulate"]
        if r["status"] != "ok":  # a rank that ran out: the estimate's verdict against the card, not an error
            total = r["env"]["gpu_total_memory"]
            need = m.memory["peak_reserved"]
            lines.append(f"| {spec.name} | --gpus {s.gpus} b{s.batch_size} s{s.seq_len} {s.precision} {s.peft} "
                         f"| {r['status']} in {r['oom']['phase'] if r.get('oom') else '?'} | - | simulate reserved "
                         f"{need / GiB:.3f} of the card's {total / GiB:.2f} GiB: verdict "
                         f"{'right' if need > total else 'WRONG'} | - | - | {t:.1f} |")
            print(lines[-1], flush=True)
            continue
        errs["analytic"].append(a.peak / meas - 1)
        errs["simulate"].append(m.peak / meas - 1)
        errs["reserved"].append(m.memory["peak_reserved"] / r["memory"]["peak_reserved"] - 1)
        states = "/".join(f"{(m.model_states[k] - r['model_states'][k]) / 2**20:+.1f}"
                          for k in ("weights", "gradients", "optimizer"))
        label = (f"--gpus {s.gpus} b{s.batch_size} s{s.seq_len} {s.precision} {s.peft}"
                 f"{' ckpt' if s.checkpointing else ''} (rank {r['env'].get('rank', 0)})")
        lines.append(f"| {spec.name} | {label} | {meas / GiB:.3f} | {a.peak / GiB:.3f} ({100 * errs['analytic'][-1]:+.1f}%) "
                     f"| {m.peak / GiB:.3f} ({100 * errs['simulate'][-1]:+.1f}%) | {100 * errs['reserved'][-1]:+.1f}% "
                     f"| {states} | {t:.1f} |")
        print(lines[-1], flush=True)
    lines += ["", "| figure | rows | median abs error | worst abs error |", "|---|---|---|---|"]
    for k, name in (("simulate", "simulate peak_allocated"), ("analytic", "analytic peak_allocated"),
                    ("reserved", "simulate peak_reserved")):
        v = [abs(x) for x in errs[k]]
        lines.append(f"| {name} | {len(v)} | {100 * statistics.median(v):.2f}% | {100 * max(v):.2f}% |")
    return emit(lines, out)


if __name__ == "__main__":
    cli(main)
