"""The comparison table: one line per setup, the measurement and the estimate side by side.

Rows pair on the model and the setup fields that decide memory (`KEY_FIELDS`), not on all of them: an
estimate is always for CUDA, and rows written by other trainmem versions may carry more or fewer
fields. When a file holds several rows of one kind for a setup, the last one counts (a re-run supersedes).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

GiB = 1024**3
SETUP_COLUMNS = ("batch_size", "grad_accum", "seq_len", "peft", "checkpointing", "precision", "optimizer", "gpu")
COLUMNS = ("model", *SETUP_COLUMNS, "measured_status", "measured_peak_allocated", "estimate_status",
           "estimate_method", "estimated_peak_allocated", "error_pct", "estimate_fits", "tokens_per_s")


KEY_FIELDS = ("batch_size", "grad_accum", "seq_len", "checkpointing", "peft", "lora_r", "lora_targets", "precision",
              "optimizer", "attention", "data", "data_mode", "gpu", "memory_cap")


def setup_key(row: dict[str, Any]) -> str:
    return json.dumps([row["model"]["name"], [row["setup"].get(k) for k in KEY_FIELDS]])


def label(row: dict[str, Any]) -> str:
    """A short name for a setup: `b16 ga4 lora ckpt fp16 @T4`."""
    s = row["setup"]
    parts = [f"b{s['batch_size']}", f"ga{s['grad_accum']}" if s["grad_accum"] > 1 else "",
             s["peft"] if s["peft"] != "none" else "", "ckpt" if s["checkpointing"] else "", s["precision"],
             f"@{s['gpu']}" if s.get("gpu") else ""]
    return " ".join(p for p in parts if p)


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per setup (first-seen order) with the COLUMNS; the error is (estimate - measured) / measured
    of peak_allocated, for setups with both an `ok` measurement and an estimate."""
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(setup_key(row), {})[row["kind"]] = row
    out = []
    for pair in by_key.values():
        m, e = pair.get("measurement"), pair.get("estimate")
        first = m or e
        line: dict[str, Any] = {"model": first["model"]["name"], "label": label(first),
                                **{k: first["setup"].get(k) for k in SETUP_COLUMNS}}
        line.update(measured_status=m["status"] if m else None, estimate_status=e["status"] if e else None,
                    measured_peak_allocated=m["memory"]["peak_allocated"] if m and m["status"] == "ok" else None,
                    estimated_peak_allocated=e["memory"]["peak_allocated"] if e else None,
                    estimate_method=e.get("method") if e else None,
                    estimate_fits=(e.get("verdict") or {}).get("fits") if e else None,
                    tokens_per_s=(m.get("throughput") or {}).get("tokens_per_s") if m else None)
        meas, est = line["measured_peak_allocated"], line["estimated_peak_allocated"]
        line["error_pct"] = round(100 * (est - meas) / meas, 2) if meas and est is not None else None
        out.append(line)
    return out


def write_csv(comparison: list[dict[str, Any]], path: Path) -> None:
    """Bytes as integers and the error in percent, for spreadsheets and scripts."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(comparison)


def gib(x: int | None) -> str:
    return "" if x is None else f"{x / GiB:.3f}"


def display_rows(comparison: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells for people: GiB with three decimals, the error as a signed percentage."""
    head = ["model", "setup", "measured", "measured GiB", "estimate", "estimated GiB", "error", "fits", "tokens/s"]
    body = []
    for c in comparison:
        est = "" if c["estimate_status"] is None else f"{c['estimate_method']} ({c['estimate_status']})"
        fits = "" if c["estimate_fits"] is None else ("yes" if c["estimate_fits"] else "no")
        body.append([c["model"], c["label"], c["measured_status"] or "", gib(c["measured_peak_allocated"]), est,
                     gib(c["estimated_peak_allocated"]), "" if c["error_pct"] is None else f"{c['error_pct']:+.1f}%",
                     fits, "" if c["tokens_per_s"] is None else f"{c['tokens_per_s']:.0f}"])
    return head, body


def markdown(comparison: list[dict[str, Any]], source: str | Path, pngs: dict[str, Path]) -> str:
    head, body = display_rows(comparison)
    lines = [f"# trainmem report: {Path(source).name}", "",
             (f"{len(comparison)} setups. `error` is the estimate's peak_allocated against the measured one "
              "(positive: the estimate is higher)."), "", "## Estimate and measurement", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    if pngs:
        lines += ["", "## Plots", ""] + [f"![{name}]({path.name})" for name, path in pngs.items()]
    return "\n".join(lines) + "\n"
