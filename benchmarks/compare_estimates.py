"""Every estimate against its measurement: the error tables docs/accuracy.md summarises.

    python benchmarks/compare_estimates.py docs/lab/data/validation-isolated-h200-2026-12-03.jsonl
    python benchmarks/compare_estimates.py docs/lab/data/validation-held-out-h200-2026-12-03.jsonl

For each measured row: trainmem's analytic and simulate methods (simulate where it models the setup) and
the default (`auto`), accelerate's "training with Adam" figure (4 x the model size in the load dtype) and
the 16-bytes-per-parameter rule, as relative errors of `peak_allocated` against
`torch.cuda.max_memory_allocated`, plus the default's `peak_reserved` against
`torch.cuda.max_memory_reserved` (simulate: the allocator replay; analytic: the calibrated ratio) and
`device_used` against cudaMemGetInfo.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import trainmem
from trainmem.estimator import estimate
from trainmem.hardware.gpus import find_gpu
from trainmem.result import read_rows

GiB = 2**30


def err(est: float, meas: float) -> float:
    return (est - meas) / meas


def measured_program(s: trainmem.TrainSetup, env: dict | None = None) -> trainmem.TrainSetup:
    """The setup as the H200 ran it. A row run with `run --gpu CARD` since 41dd4d4 emulated the card
    (`env.emulated`: its allocator cap, cuBLAS workspace and SDPA kernels), so the setup is estimated as
    given. Earlier capped rows kept the H200's kernels and workspaces, with the allocator capped at
    capacity - 0.4 GiB (gpus.py's context then): estimate that program, and judge the verdict on the card."""
    if not s.gpu or (env or {}).get("emulated"):
        return s
    return s.replace(gpu=None, memory_cap=find_gpu(s.gpu).capacity - int(0.4 * GiB))


def compare(path: str, out: str | None = None, keep: list | None = None) -> int:
    """Print (and with `out`, write) the error table of `path`; `keep` collects (row, {method: Breakdown})."""
    rows = read_rows(path)
    table, errs = [], {"analytic": [], "simulate": [], "auto": [], "device": [], "accelerate": [], "16B": [],
                       "reserved": [], "reserved (replay)": [], "reserved (ratio)": [],
                       "device (replay)": [], "device (ratio)": []}
    times = {"analytic": [], "simulate": []}
    oom_fits = 0
    verdicts: list[str] = []
    for r in rows:
        s = trainmem.TrainSetup.from_dict(r["setup"])
        program = measured_program(s, r.get("env"))
        spec = trainmem.ModelSpec.resolve(r["model"]["name"])
        meas = r["memory"]["peak_allocated"]
        res = {}
        for method in ("analytic", "simulate"):
            if method == "analytic":
                estimate(spec, program, method)  # warm the parameter inventory: time the setup, not the model build
            t0 = time.perf_counter()
            b = estimate(spec, program, method)
            times[method].append(time.perf_counter() - t0)
            res[method] = b
            if r["status"] == "ok":  # an OOM row's figures stop at the failed request: no error to take
                errs[method].append(err(b.peak, meas))
        if keep is not None:
            keep.append((r, res))
        auto = res["simulate"]  # `auto` simulates every single-GPU setup
        how = "replay" if auto.method == "simulate" else "ratio"  # simulate replays the allocator
        row_errs = {"auto": err(auto.peak, meas), "device": err(auto.memory["device_used"], r["memory"]["device_used"]),
                    "reserved": err(auto.memory["peak_reserved"], r["memory"]["peak_reserved"])}
        if r["status"] == "ok":
            for k in ("auto", "device", "reserved"):
                errs[k].append(row_errs[k])
            errs[f"reserved ({how})"].append(row_errs["reserved"])
            errs[f"device ({how})"].append(row_errs["device"])
        if r["status"] == "oom" and auto.fits(r["setup"].get("gpu") or "H200"):
            oom_fits += 1
        if s.gpu:  # run under the card's cap: the real outcome against the estimate's verdict for that card
            v = auto.verdict(s.gpu)
            real = r["status"] == "ok"
            verdicts.append(f"| {spec.name} b{s.batch_size} s{s.seq_len} {s.precision} {s.peft} | {s.gpu} | "
                            f"{'ok' if real else 'oom'} ({r['memory']['peak_reserved'] / GiB:.2f} GiB reserved) | "
                            f"{v['level']} ({v['headroom'] / GiB:+.2f} GiB headroom) | "
                            f"{'right' if (v['level'] != 'no') == real else 'WRONG'} |")
        n = spec.parameter_count
        acc = 4 * n * (2 if s.precision in ("fp16", "bf16") else 4)
        if r["status"] == "ok":
            errs["accelerate"].append(err(acc, meas))
            errs["16B"].append(err(16 * n, meas))
        label = (f"{spec.name} b{s.batch_size} s{s.seq_len} {s.precision} {s.peft}"
                 f"{' ckpt' if s.checkpointing else ''}{' eager' if s.attention == 'eager' else ''}"
                 f"{' ga' + str(s.grad_accum) if s.grad_accum > 1 else ''}"
                 f"{'' if s.optimizer == 'adamw' else ' ' + s.optimizer}")
        if r["status"] != "ok":
            table.append(f"| {label} | {r['status']} at {r['memory']['peak_allocated'] / GiB:.3f} "
                         f"({r['memory']['peak_reserved'] / GiB:.2f} reserved) | {(r.get('oom') or {}).get('phase', '-')} "
                         f"| {res['analytic'].peak / GiB:.3f} | {res['simulate'].peak / GiB:.3f} | - | - | - | - | - |")
            continue
        sim = res.get("simulate")
        table.append(f"| {label} | {meas / GiB:.3f} | {r['peak_phase']} | {res['analytic'].peak / GiB:.3f} "
                     f"({100 * err(res['analytic'].peak, meas):+.1f}%) | "
                     + (f"{sim.peak / GiB:.3f} ({100 * err(sim.peak, meas):+.1f}%)" if sim else "-")
                     + f" | {100 * row_errs['auto']:+.1f}% | {100 * row_errs['reserved']:+.1f}% ({how}) "
                     f"| {100 * row_errs['device']:+.1f}% "
                     f"| {100 * err(acc, meas):+.0f}% | {100 * err(16 * n, meas):+.0f}% |")

    def summary(name: str) -> str:
        a = [abs(x) for x in errs[name]]
        return f"| {name} | {len(a)} | {100 * statistics.median(a):.2f}% | {100 * max(a):.2f}% |"

    # OOM rows (a near-capacity setup that ran out under its card's cap) count in the verdicts, not the errors

    lines = ["| setup | measured peak GiB | measured peak phase | analytic | simulate | auto | peak_reserved "
             "| device_used | accelerate | 16 B/param |", "|---|---|---|---|---|---|---|---|---|---|"] + table
    lines += ["", "| method | setups | median abs error | worst abs error |", "|---|---|---|---|"]
    lines += [summary(k) for k in ("auto", "analytic", "simulate", "reserved", "reserved (replay)", "reserved (ratio)",
                                   "device", "device (replay)", "device (ratio)", "accelerate", "16B") if errs[k]]
    lines += ["", f"analytic: median {1000 * statistics.median(times['analytic']):.1f} ms per setup; "
              f"simulate: median {statistics.median(times['simulate']):.2f} s, max {max(times['simulate']):.2f} s "
              f"(this machine); measured OOMs estimated as fitting: {oom_fits}"]
    if verdicts:
        lines += ["", "| near-capacity setup | card (cap) | measured under the cap | estimate's verdict (fits/tight: runs) | |",
                  "|---|---|---|---|---|"] + verdicts
    return emit(lines, out)


def emit(lines: list[str], out: str | None) -> int:
    """Print the table, and with `out` write it there too (docs/data/errors-*.md at the current estimator;
    a held-out set's table at the commit it was reported at goes to docs/lab/data/errors-*-at-COMMIT.md)."""
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return 0


def cli(table: Callable[[str, str | None], int]) -> None:
    """`SCRIPT JSONL [--out FILE.md]`: the error table of JSONL's measured rows."""
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--out")
    a = ap.parse_args()
    sys.exit(table(a.jsonl, a.out))


if __name__ == "__main__":
    cli(compare)
