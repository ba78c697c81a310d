"""Every causal-LM model type of the installed transformers through trainmem's doors: a tiny config of each,
trained one step by plain transformers, then `estimate` (simulate, analytic), `run --device cpu` with its
model states compared to the byte, a LoRA estimate, and the LoRA all-linear and QLoRA estimates
(`lab.registry.check`, `lab.registry.VARIANTS`).

    nice -n 10 python benchmarks/registry.py          # every type: docs/lab/data/registry-<date>.jsonl, docs/models.md
    python benchmarks/registry.py --types opt llama --no-write        # a few, printed only
    python benchmarks/registry.py --types opt --out /tmp/opt.jsonl    # a few, rows to a file of your own
    python benchmarks/registry.py --render docs/lab/data/registry-2026-12-05.jsonl   # the table again, no runs

Each type runs in its own process, forked from a server that has imported torch, transformers and trainmem
once (multiprocessing's forkserver), so that a crash or a hang (`--timeout`, default 120 s) ends that type's
row only and no type pays the imports. One type at a time unless `--jobs`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/

PRELOAD = ["torch", "transformers", "peft", "lab.registry", "trainmem.estimator",
           "trainmem.isolation.runner"]


def _child(model_type: str, conn: Any) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from transformers.utils import logging

    from lab import registry

    logging.set_verbosity_error()
    torch.set_num_threads(1)  # tiny models: one thread is as fast, and leaves the shared cores alone
    conn.send(registry.check(model_type))
    conn.close()


def run_types(types: list[str], timeout: float, jobs: int, out: Path | None) -> list[dict[str, Any]]:
    """Each type in its own forked process, `jobs` at a time; a row per type, appended to `out` as it ends."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    pending = list(types)
    running: dict[str, tuple[Any, Any, float]] = {}
    rows: list[dict[str, Any]] = []
    while pending or running:
        while pending and len(running) < jobs:
            t = pending.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(t, child), daemon=True)
            proc.start()
            child.close()
            running[t] = (proc, parent, time.perf_counter())
        time.sleep(0.05)
        for t, (proc, conn, t0) in list(running.items()):
            row = None
            if conn.poll():
                try:
                    row = conn.recv()
                except EOFError:
                    pass
            elapsed = time.perf_counter() - t0
            if row is None and proc.is_alive() and elapsed < timeout:
                continue
            if row is None:
                if proc.is_alive():
                    proc.kill()
                    why = f"timeout: still running after {timeout:.0f} s"
                else:
                    why = f"the process died (exit {proc.exitcode})"
                row = {"type": t, "trains_plain": None, "plain_error": why, "seconds": round(elapsed, 2)}
            proc.join(5)
            conn.close()
            del running[t]
            rows.append(row)
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            print(f"{len(rows):3d}/{len(types)} {_summary(row)}", flush=True)
    order = {t: i for i, t in enumerate(types)}
    return sorted(rows, key=lambda r: order[r["type"]])


def _summary(row: dict[str, Any]) -> str:
    def door(v: Any) -> str:
        return ("ok" if v == "ok" else "fallback" if str(v).startswith("fallback")
                else "refused" if str(v).startswith("refused") else "FAIL" if v else "-")

    doors = [f"{k}={door(row.get(k))}" for k in ("estimate_simulate", "estimate_analytic", "run_cpu", "lora",
                                                  "lora_all_linear", "qlora")]
    exact = {True: "exact", False: "NOT EXACT", None: ""}[row.get("states_exact")]
    plain = "" if row.get("trains_plain") else f" not trainable: {row.get('plain_error', '')[:120]}"
    return f"{row['type']:26s} {row['seconds']:6.1f}s {' '.join(doors)} {exact}{plain}"


DOORS = ("estimate_simulate", "estimate_analytic", "run_cpu")


def _ok(value: Any) -> str:
    if isinstance(value, str) and value.startswith("fallback to "):
        return "↪ " + value.split()[2].rstrip(":")  # answered by the other method
    return "✓" if value == "ok" else "✗" if value else "·"


def _short(text: str, width: int) -> str:
    """A recorded reason for the table: without its frames and the harness's temporary folder."""
    return re.sub(r"/\S*?/trainmem-registry-[^/]+/", "", str(text).split(" @ ")[0])[:width]


def _variant(value: Any) -> str:
    """A `VARIANTS` cell: ✓ simulated, `refused: <why>` (the door's one-line problems), ✗ failed (the note says
    why), · not tried."""
    if isinstance(value, str) and value.startswith("refused: "):
        return _short(value, 160).replace("|", "\\|")
    return _ok(value)


def _note(row: dict[str, Any]) -> str:
    """The first failure's one-line reason, without its frames, for the table; else an assumption the
    estimate made (its routing note) or a fallback to the other method."""
    if not row.get("trains_plain"):
        return _short(row.get("plain_error", ""), 160)
    for k in DOORS:
        if row.get(k) not in ("ok", None) and not str(row[k]).startswith("fallback"):
            return f"{k.replace('estimate_', '')}: " + _short(row[k], 150)
    if row.get("states_exact") is False:
        return "model states differ: " + json.dumps(row.get("measured_states")) + " measured vs " + \
            json.dumps(row.get("estimated_states"))
    for k in ("lora", "lora_all_linear", "qlora"):
        if row.get(k) not in ("ok", None) and not str(row[k]).startswith("refused: "):
            return f"{k}: " + _short(row[k], 150)
    routing = [n for n in row.get("notes_simulate", []) if n.startswith("routing:")]
    if routing:
        return routing[0].split(";")[0][:150]
    for k in DOORS[:2]:
        if str(row.get(k, "")).startswith("fallback"):
            return f"{k.replace('estimate_', '')}: " + str(row[k])[:150]
    return ""


def render(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """docs/models.md: the command, versions and date, the counts, then one row per type."""
    trainable = [r for r in rows if r.get("trains_plain")]

    def count(key: str) -> int:
        return sum(1 for r in trainable if r.get(key) == "ok")

    def fallback(key: str) -> int:
        return sum(1 for r in trainable if str(r.get(key, "")).startswith("fallback"))

    def refused(key: str) -> int:
        return sum(1 for r in trainable if str(r.get(key, "")).startswith("refused: "))

    exact = sum(1 for r in trainable if r.get("states_exact"))
    compared = sum(1 for r in trainable if r.get("states_exact") is not None)
    clean = sum(1 for r in trainable if r.get("states_exact") and r.get("estimate_simulate") == "ok"
                and r.get("run_cpu") == "ok")
    lines = [
        "# Every causal-LM model type through trainmem",
        "",
        f"`{header['command']}` on {header['date']} (UTC): transformers {header['transformers']}, "
        f"torch {header['torch']}, peft {header['peft']}; {header['seconds']:.0f} s on {header['host']}"
        + (f" (load average {header['load_average']} at the end: the cores are shared)" if header.get("load_average")
           else "") + ".",
        "",
        "Each type of transformers' causal-LM mapping gets a tiny config made from its config class "
        "(`lab.registry.tiny_config`: hidden 64, 2 layers or one of each kind, 4 heads, "
        "1024 tokens, 4 experts top-2), is trained one step by plain transformers on the CPU, then goes "
        "through `trainmem estimate` (simulate, analytic: batch 2 x 32 tokens, fp32), `trainmem run "
        "--device cpu` (2 steps), whose measured weights, gradients and optimizer states must equal the "
        "estimate's to the byte, and three simulated LoRA estimates (rank 4): the default targets (peft's, else "
        "trainmem's pick), every Linear (`--lora-targets all-linear`) and QLoRA (`--peft qlora`, the estimate only: "
        "a 4-bit run needs a GPU), each of the last two estimated or refused at the door with its reason. "
        "✓ works, ✗ fails (the note says why), ↪ answered by the other method (simulate falls back to "
        "analytic where the meta device cannot run the step; analytic to simulate where its closed form has "
        "no terms for the layers). Rows: [docs/lab/data](lab/data); how the failures were found and fixed: "
        "[the lab note](lab/models-diagnosis-2026-12-05.md).",
        "",
        f"- types in the mapping: {len(rows)}",
        f"- trained by plain transformers: {len(trainable)}",
        f"- estimate ok: simulate {count('estimate_simulate')} (fell back to analytic: "
        f"{fallback('estimate_simulate')}), analytic {count('estimate_analytic')} (fell back to simulate: "
        f"{fallback('estimate_analytic')})",
        f"- run --device cpu ok: {count('run_cpu')}; model states exact: {exact} of the {compared} where an "
        "estimate and the run both worked",
        f"- simulated, run and states exact: {clean}",
        f"- LoRA estimate ok (default targets): {count('lora')}",
        f"- LoRA all-linear: estimated {count('lora_all_linear')}, refused {refused('lora_all_linear')}; "
        f"QLoRA: estimated {count('qlora')}, refused {refused('qlora')}",
        "",
        "| type | family | kind | estimate: simulate | estimate: analytic | run (cpu) | states exact | LoRA "
        "| LoRA all-linear | QLoRA | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in trainable:
        exact_mark = "✓" if r.get("states_exact") else "✗" if r.get("states_exact") is False else "·"
        note = _note(r).replace("|", "\\|")
        lines.append(f"| {r['type']} | {r.get('family', '')} | {r.get('kind', '')} | {_ok(r.get('estimate_simulate'))} "
                     f"| {_ok(r.get('estimate_analytic'))} | {_ok(r.get('run_cpu'))} | {exact_mark} "
                     f"| {_ok(r.get('lora'))} | {_variant(r.get('lora_all_linear'))} | {_variant(r.get('qlora'))} "
                     f"| {note} |")
    lines += ["", "## Types plain transformers does not train (as built here)", "",
              "| type | family | why |", "|---|---|---|"]
    for r in rows:
        if not r.get("trains_plain"):
            why = _short(r.get("plain_error", ""), 300).replace("|", "\\|")
            lines.append(f"| {r['type']} | {r.get('family', '')} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", nargs="*", help="model types (default: the whole causal-LM mapping)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per type")
    p.add_argument("--jobs", type=int, default=1, help="types at a time (each a process)")
    p.add_argument("--no-write", action="store_true", help="print only: no jsonl, no docs/models.md")
    p.add_argument("--out", help="the jsonl to write (default docs/lab/data/registry-<date>.jsonl); with it, no table")
    p.add_argument("--render", help="re-render docs/models.md from this jsonl (no runs)")
    args = p.parse_args(argv)

    import peft
    import torch
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lab import repository

    if args.render:
        rows = [json.loads(line) for line in Path(args.render).read_text().splitlines() if line.strip()]
        header = rows.pop(0)
    else:
        types = args.types or list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
        out = (None if args.no_write else Path(args.out) if args.out
               else repository.docs("lab", "data", f"registry-{date}.jsonl"))
        header = {"command": "python benchmarks/registry.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else ""),
                  "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                  "transformers": transformers.__version__, "torch": torch.__version__, "peft": peft.__version__,
                  "host": f"{os.cpu_count()} CPU cores, {args.jobs} type(s) at a time, 1 torch thread each",
                  "types": len(types)}
        if out is not None:
            out.write_text(json.dumps(header) + "\n")
        t0 = time.perf_counter()
        rows = run_types(types, args.timeout, args.jobs, out)
        header["seconds"] = time.perf_counter() - t0
        header["load_average"] = round(os.getloadavg()[1], 1)  # the machine's 5-minute load at the end
        if out is not None:  # the header again, now with the sweep's duration
            lines = out.read_text().splitlines()
            lines[0] = json.dumps(header)
            out.write_text("\n".join(lines) + "\n")
        slow = sorted(rows, key=lambda r: -r.get("seconds", 0))[:8]
        print(f"{header['seconds']:.0f} s for {len(rows)} types; slowest: "
              + ", ".join(f"{r['type']} {r['seconds']:.0f}s" for r in slow))
    if not args.no_write and not args.out:
        repository.docs("models.md").write_text(render(rows, header))


if __name__ == "__main__":
    main()
