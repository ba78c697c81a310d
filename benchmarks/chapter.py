"""Measure the seed chapter's seven runs with `trainmem run`, uncapped and capped to a T4.

    python benchmarks/chapter.py OUT_DIR [--gpus none,T4]

Writes OUT_DIR/chapter.jsonl (one result object per run, appended as each finishes) and
OUT_DIR/chapter.md (the table next to the chapter's published numbers). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import trainmem
from trainmem.config.chapter import GB, MODEL, RUNS


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def phase_allocated(row: dict, name: str) -> float | None:
    for ph in row["phases"]:
        if ph["phase"] == name:
            return ph["allocated"] / GB
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gpus", default="none,T4")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "chapter.jsonl")
    spec = trainmem.ModelSpec.resolve(MODEL)
    rows = []
    for gpu in args.gpus.split(","):
        for run in RUNS:
            setup = run.setup.replace(gpu=None if gpu == "none" else gpu, steps=args.steps)
            t0 = time.time()
            r = trainmem.run(spec, setup)
            r.notes.append(f"chapter run: {run.label}")
            r.append_to(path)
            row = r.to_dict()
            rows.append((run, gpu, row))
            print(f"{run.label:28s} gpu={gpu:5s} {r.status:5s} peak={r.memory['peak_allocated'] / GB:.3f} GB "
                  f"in {time.time() - t0:.0f}s", flush=True)
            if r.status == "error":
                print(r.error, file=sys.stderr)
    lines = ["| run | cap | status | after load (ours / book) | at first step (ours / book) | optimizer (ours / book) "
             "| gradients (ours / book) | peak allocated | peak reserved | device used | tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run, gpu, row in rows:
        m, ms = row["memory"], row["model_states"]
        first = phase_allocated(row, "step1.optimizer")
        status = row["status"] if row["status"] != "oom" else f"oom in {row['oom']['phase']}"
        tps = row["throughput"].get("tokens_per_s")
        lines.append(
            f"| {run.label} | {gpu} | {status} | {fmt(phase_allocated(row, 'load'))} / {fmt(run.after_load_gb)} "
            f"| {fmt(first)} / {fmt(run.at_first_step_gb)} | {fmt(ms['optimizer'] / GB)} / {fmt(run.optimizer_gb)} "
            f"| {fmt(ms['gradients'] / GB)} / {fmt(run.gradients_gb)} | {fmt(m['peak_allocated'] / GB)} "
            f"| {fmt(m['peak_reserved'] / GB)} | {fmt(m['device_used'] / GB)} | {f'{tps:,.0f}' if tps else '-'} |")
    with open(os.path.join(args.out, "chapter.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(rows[0][2]["env"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
