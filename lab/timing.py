"""The step-time model against measured step times: the rows committed in docs/lab/data, each predicted at the
card it ran on; the fit and the cross-validation of the model's constants; the comparison table.

A measured row's step time is `throughput.step_time_median_s` where the row has it (runs made after it existed),
else `step_time_s`. Each row is predicted at the speed of the card it ran on (`ran_on`: the H200 or the H100). Rows measured under `--gpu CARD` or `--memory-cap` ran there with capped memory, at that card's
speed: they are predicted at its speed, with the SDPA kernel the emulated card has (no flash on a T4 or V100).
Rows of `--engine trainer` (Trainer's own loop, gradient clipping) are left out.

`compare` splits rows into in-sample (the files the constants were fitted on: `manifest.fit_files`), held-out (any other
file) and sharded (one rank of an N-GPU run on a fake process group, whose FSDP gathers the model does not time:
apart, so that they do not count as held-out errors), and prints per row the predicted and measured step time
with the error, the median and worst absolute error, and the Spearman rank correlation of predicted vs measured
within each model. `benchmarks/time_validate.py` is its command line.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from collections.abc import Callable
from typing import Any

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.estimator.memory import states
from trainmem.estimator.time import step as timing
from trainmem.hardware.gpus import CATALOG, GPU, find_gpu

from . import manifest

Row = dict[str, Any]

def fit_paths() -> list[str]:
    """The paths of the files the step-time constants are fitted on (`manifest.fit_files`)."""
    return [manifest.path(name) for name in manifest.fit_files()]


def measured_s(row: Row) -> float | None:
    """A measured row's seconds per step: the median of its steady steps where it was timed over several."""
    tp = row.get("throughput") or {}
    return tp.get("step_time_median_s") or tp.get("step_time_s")


def timed(found: list[tuple[str, Row]]) -> list[tuple[str, Row]]:
    """The rows timed as the median of several steady steps: the fit's rows. The first files time one step
    each, whose noise (`noise`: the same setup measured twice differs by a median 20%, up to 126%) the
    fit would otherwise chase; `compare` still reports them."""
    return [(p, r) for p, r in found if (r.get("throughput") or {}).get("step_time_median_s")]


MEASURED_ON = {"H200": "H200", "H100": "H100-80GB"}
"""The cards measurements ran on: a word of the device name (`env.gpu`) to its catalog entry."""


def ran_on(row: Row) -> str | None:
    """The catalog name of the card a measured row ran on; None for another device (or the CPU)."""
    name = str(row.get("env", {}).get("gpu"))
    return next((card for word, card in MEASURED_ON.items() if word in name), None)


def rows(paths: list[str]) -> list[tuple[str, Row]]:
    """(file, row) of every H200 or H100 measurement with a step time, each measurement once (the chapter's
    rows are in two files)."""
    seen, out = set(), []
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            if (r.get("kind") != "measurement" or r.get("status") != "ok" or ran_on(r) is None
                    or not measured_s(r) or r["setup"].get("engine") == "trainer"):
                continue
            key = (r["model"]["name"], json.dumps(r["setup"], sort_keys=True), measured_s(r))
            if key not in seen:
                seen.add(key)
                out.append((path, r))
    return out


@functools.lru_cache(maxsize=None)
def _workload(model: str, setup_json: str, card: str) -> timing.Workload:
    """Cached by setup: a fit predicts every row hundreds of times, and the workload (kernel counts from a
    meta trace) does not change with the constants."""
    spec = ModelSpec.resolve(model)
    setup = TrainSetup.from_dict(json.loads(setup_json))
    # under `--gpu CARD` the run had the emulated card's SDPA kernels (emulation.kernels: no flash on a T4
    # or V100) at the speed of the card it ran on: the workload takes the kernel from the emulated card,
    # `predict` the speed from the real one
    kernels = find_gpu(setup.gpu) if setup.gpu else CATALOG[card]
    setup = setup.replace(gpu=None, memory_cap=None)
    precision = setup.resolved_precision(spec, "cuda")
    return timing.workload(spec, states.inventory(spec, setup, precision), setup, precision, kernels)


def row_work(row: Row) -> tuple[timing.Workload, GPU]:
    """A measured row's workload and the catalog card it ran on."""
    card = ran_on(row) or "H200"
    return _workload(row["model"]["name"], json.dumps(row["setup"], sort_keys=True), card), CATALOG[card]


def predict(row: Row) -> float:
    """Predicted seconds per step of a measured row's setup on the card it ran on (under `--gpu CARD`
    too: a cap changes the memory, not the speed; the attention kernel is the emulated card's, `_workload`)."""
    return timing.step_time(*row_work(row)).step_s


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties at their mean rank): whether the model orders setups as they ran,
    whatever its scale."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def sharded(row: Row) -> bool:
    """One rank of an N-GPU run (on a fake process group)."""
    return (row["setup"].get("gpus") or 1) > 1


def label(row: Row) -> str:
    """A row's setup in one short line (`qwen2.5-0.5b b8x1 s1024 bf16 lora ckpt`): the key of the tables, and
    of the committed in-sample table's rows."""
    s = row["setup"]
    extra = [s["peft"] if s["peft"] != "none" else "", "ckpt" if s["checkpointing"] else "",
             s["optimizer"] if s["optimizer"] != "adamw" else "", s["attention"] if s["attention"] == "eager" else "",
             f"{s['gpus']} GPUs {s.get('shard') or ''}".strip() if sharded(row) else ""]
    return (f"{row['model']['name']} b{s['batch_size']}x{s['grad_accum']} s{s['seq_len']} {s['precision']} "
            + " ".join(e for e in extra if e)).strip()


def summary(found: list[tuple[Row, float, float]]) -> dict[str, Any]:
    """Median and worst absolute relative error, and Spearman within each model (models with >= 3 rows)."""
    errs = [abs(p - m) / m for _, p, m in found]
    by_model: dict[str, list[tuple[float, float]]] = {}
    for r, p, m in found:
        by_model.setdefault(r["model"]["name"], []).append((p, m))
    rho = {k: spearman([p for p, _ in v], [m for _, m in v]) for k, v in by_model.items() if len(v) >= 3}
    return {"rows": len(found), "median": statistics.median(errs) if errs else float("nan"),
            "worst": max(errs, default=float("nan")), "spearman": rho}


def compare(paths: list[str]) -> int:
    """Print, per set (in-sample, held-out, sharded), each row's measured and predicted step time and the
    set's summary: the table of docs/data/time-in-sample.md when given every file of docs/lab/data."""
    fit = {os.path.abspath(p) for p in fit_paths()}
    sets: dict[str, list[tuple[Row, float, float]]] = {"in-sample": [], "held-out": [], "sharded": []}
    for path, r in rows(paths):
        # one rank of a sharded run on a fake process group: FSDP's gathers and reshards are not modelled
        which = ("sharded" if sharded(r) else
                 "in-sample" if os.path.abspath(path) in fit else "held-out")
        sets[which].append((r, predict(r), measured_s(r)))
    for which, found in sets.items():
        if not found:
            continue
        print(f"\n## {which} ({len(found)} rows)\n")
        print("| setup | measured ms | predicted ms | error |\n|---|---:|---:|---:|")
        for r, p, m in sorted(found, key=lambda x: label(x[0])):
            print(f"| {label(r)} | {m * 1e3:.1f} | {p * 1e3:.1f} | {(p - m) / m:+.0%} |")
        s = summary(found)
        print(f"\n{which}: {s['rows']} rows, median |error| {s['median']:.1%}, worst {s['worst']:.1%}; Spearman "
              "within each model: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(s["spearman"].items())))
    return 0


def fit_rows(data: list[Row], start: dict[str, float] | None = None,
             quiet: bool = False) -> tuple[dict[str, float], float]:
    """Least squares on log(predicted / measured) over `data`, Nelder-Mead in log space from `start` (the
    committed values by default), restarted once from its own best point. Sets the constants of the step-time
    module (callers that must not keep them restore them, as `cv` does) and returns them and the rms log
    error."""
    works = [(*row_work(r), measured_s(r)) for r in data]
    names = list(timing.FITTED)
    start = start or {n: getattr(timing, n) for n in names}
    x0 = [math.log(start[n]) for n in names]

    def loss(x: list[float]) -> float:
        for n, v in zip(names, x):
            setattr(timing, n, math.exp(v))
        if timing.EFF_MATMUL > 1 or timing.EFF_BANDWIDTH > 1 or timing.EFF_FLASH > 1 or timing.EFF_EFFICIENT > 1:
            return 1e9
        return sum(math.log(timing.step_time(w, card).step_s / m) ** 2 for w, card, m in works) / len(works)

    best = nelder_mead(loss, nelder_mead(loss, x0), step=0.1)
    fitted = {n: math.exp(v) for n, v in zip(names, best)}
    rms = loss(best) ** 0.5
    if not quiet:
        print(f"fitted on {len(data)} rows, rms log error {rms:.3f}:")
        for n, v in fitted.items():
            print(f"{n} = {v:.4g}")
    return fitted, rms


def fit(paths: list[str] | None = None) -> dict[str, float]:
    """Refit `timing.FITTED` on the `timed` rows of `paths` (default: `fit_paths`): least squares on
    log(predicted / measured), Nelder-Mead in log space from the committed values. Prints the constants to
    paste into the step-time module."""
    return fit_rows([r for _, r in timed(rows(paths or fit_paths()))])[0]


def cv(paths: list[str] | None = None) -> int:
    """Cross-validation of the model's structure on the fitting rows (default: `fit_paths`), without a GPU:
    leave one file out (fit the constants on every other file's rows, predict the left-out file's) and leave one
    model out (the same by model name). Prints median and worst |error| of the out-of-fold predictions and the
    Spearman within each model of the leave-one-file-out predictions. Not a held-out check: the structure itself
    was chosen looking at every row. The committed constants are restored after."""
    data = timed(rows(paths or fit_paths()))
    committed = {n: getattr(timing, n) for n in timing.FITTED}
    groupings: tuple[tuple[str, Callable[[tuple[str, Row]], str]], ...] = (
        ("leave-one-file-out", lambda fr: os.path.basename(fr[0])),
        ("leave-one-model-out", lambda fr: fr[1]["model"]["name"]))
    try:
        for name, key in groupings:
            found: list[tuple[Row, float, float]] = []
            for group in sorted({key(fr) for fr in data}):
                train = [fr[1] for fr in data if key(fr) != group]
                test = [fr[1] for fr in data if key(fr) == group]
                fit_rows(train, committed, quiet=True)
                found += [(r, predict(r), measured_s(r)) for r in test]
            s = summary(found)
            print(f"{name}: {s['rows']} rows, median |error| {s['median']:.1%}, worst {s['worst']:.1%}; Spearman "
                  "within each model: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(s["spearman"].items())))
    finally:
        for n, v in committed.items():
            setattr(timing, n, v)
    return 0


SPEED_KEYS = ("batch_size", "grad_accum", "seq_len", "checkpointing", "peft", "lora_r", "lora_targets",
              "precision", "optimizer", "attention", "engine", "gpus", "shard", "offload")
"""Setup fields that change what a step computes (not the card a run emulates, its cap, steps or seed)."""
SPEED_DEFAULTS = {"attention": "sdpa", "engine": "loop", "gpus": 1, "shard": "none", "offload": "none",
                  "lora_targets": None}
"""What rows written before a field existed ran with."""


def noise(paths: list[str] | None = None) -> int:
    """Setups measured more than once (same model, same `SPEED_KEYS`) among `paths` (default: `fit_paths`):
    each one's spread, max / min - 1, and each measurement's |deviation| from its setup's median: what no model
    of the setup alone can explain."""
    groups: dict[tuple[str, str], list[float]] = {}
    for _, r in rows(paths or fit_paths()):
        setup = {**SPEED_DEFAULTS, **{k: r["setup"][k] for k in SPEED_KEYS if r["setup"].get(k) is not None}}
        if setup["peft"] == "none":
            setup.pop("lora_r"), setup.pop("lora_targets")
        key = (r["model"]["name"], json.dumps(setup, sort_keys=True))
        groups.setdefault(key, []).append(measured_s(r))
    rep = {k: v for k, v in groups.items() if len(v) > 1}
    spreads, devs = [], []
    print("| setup | n | min ms | max ms | max/min - 1 |\n|---|---:|---:|---:|---:|")
    for (model, setup), v in sorted(rep.items(), key=lambda kv: -max(kv[1]) / min(kv[1])):
        spreads.append(max(v) / min(v) - 1)
        med = statistics.median(v)
        devs += [abs(x - med) / med for x in v]
        name = label({"model": {"name": model}, "setup": {"lora_r": 8, **json.loads(setup)}})
        print(f"| {name} | {len(v)} | {min(v) * 1e3:.1f} | {max(v) * 1e3:.1f} | {spreads[-1]:.0%} |")
    print(f"\n{len(rep)} setups measured more than once ({sum(len(v) for v in rep.values())} rows): spread "
          f"max/min - 1 median {statistics.median(spreads):.1%}, worst {max(spreads):.1%}; |deviation from the "
          f"setup's median| median {statistics.median(devs):.1%}, 90th percentile "
          f"{sorted(devs)[int(0.9 * len(devs))]:.1%}, worst {max(devs):.1%}")
    return 0


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], step: float = 0.3,
                iters: int = 400) -> list[float]:
    """A plain Nelder-Mead minimiser (no scipy in the dependencies)."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(exp)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                simplex = [simplex[0]] + [[b + 0.5 * (x - b) for b, x in zip(simplex[0], s)] for s in simplex[1:]]
                vals = [vals[0]] + [f(s) for s in simplex[1:]]
    return simplex[min(range(n + 1), key=vals.__getitem__)]
