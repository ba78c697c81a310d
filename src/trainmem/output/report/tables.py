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
           "estimate_method", "estimated_peak_allocated", "error_pct", "estimate_fits", "estimate_level",
           "tokens_per_s")


KEY_FIELDS = ("batch_size", "grad_accum", "seq_len", "checkpointing", "peft", "lora_r", "lora_targets", "precision",
              "optimizer", "attention", "data", "data_mode", "gpu", "memory_cap")


def setup_key(row: dict[str, Any]) -> str:
    """What pairs a measurement with its estimate: the model and the setup fields that shape memory (`KEY_FIELDS`)."""
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
                    estimate_level=level(e.get("verdict")) if e else None,
                    tokens_per_s=(m.get("throughput") or {}).get("tokens_per_s") if m else None)
        meas, est = line["measured_peak_allocated"], line["estimated_peak_allocated"]
        line["error_pct"] = round(100 * (est - meas) / meas, 2) if meas and est is not None else None
        out.append(line)
    return out


def level(verdict: dict[str, Any] | None) -> str | None:
    """fits / tight / no; rows written before levels existed have only `fits`."""
    if not verdict:
        return None
    return verdict.get("level") or ("fits" if verdict["fits"] else "no")


def chapter(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed chapter's published figures beside trainmem's, one dict per chapter run found in `rows`
    (its measurement and estimate; rows on a card win over rows without one), in the chapter's order."""
    from trainmem.config.chapter import MODEL, RUNS, find_run

    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        run = find_run(row["setup"]) if row["model"]["name"] == MODEL and row["status"] in ("ok", "oom") else None
        if run is None:
            continue
        entry = found.setdefault(run.label, {})
        if row["kind"] not in entry or row["setup"].get("gpu") or not entry[row["kind"]]["setup"].get("gpu"):
            entry[row["kind"]] = row
    out = []
    for run in RUNS:
        if run.label not in found:
            continue
        m, e = found[run.label].get("measurement"), found[run.label].get("estimate")
        states = (e or m)["model_states"]
        out.append({"run": run.label, "book_after_load": run.after_load_gb, "book_first_step": run.at_first_step_gb,
                    "book_note": run.published_note, "book_optimizer": run.optimizer_gb,
                    "book_gradients": run.gradients_gb, "optimizer": states["optimizer"],
                    "gradients": states["gradients"],
                    "measured": (m["memory"]["peak_allocated"] if m["status"] == "ok" else None) if m else None,
                    "measured_status": m["status"] if m else None,
                    "estimated": e["memory"]["peak_allocated"] if e else None,
                    "level": level(e.get("verdict")) if e else None,
                    "gpu": ((e or {}).get("verdict") or {}).get("gpu"), "why": run.why})
    return out


def chapter_display(lines: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The chapter table as headers and rows of text, shared by the markdown and the HTML page."""
    head = ["run", "book: after first step", "book: states (opt / grad)", "trainmem: states (opt / grad)",
            "trainmem: measured peak", "trainmem: estimated peak", "verdict", "why they differ"]

    def book(x: float | None) -> str:
        return "" if x is None else f"{x:.3f}"

    body = []
    for c in lines:
        first = book(c["book_first_step"])
        note = c["book_note"] if not first else f" ({c['book_note']})" if c["book_note"] else ""
        measured = gib(c["measured"]) or (c["measured_status"] or "")
        body.append([c["run"], first + note,
                     f"{book(c['book_optimizer'])} / {book(c['book_gradients'])}" if c["book_optimizer"] else "",
                     f"{gib(c['optimizer'])} / {gib(c['gradients'])}", measured, gib(c["estimated"]),
                     f"{c['level']} on the {c['gpu']}" if c["level"] else "", c["why"]])
    return head, body


def write_csv(comparison: list[dict[str, Any]], path: Path) -> None:
    """Bytes as integers and the error in percent, for spreadsheets and scripts."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(comparison)


def gib(x: int | None) -> str:
    """Bytes as GiB with three decimals, empty for a missing figure."""
    return "" if x is None else f"{x / GiB:.3f}"


def display_rows(comparison: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells for people: GiB with three decimals, the error as a signed percentage."""
    head = ["model", "setup", "measured", "measured GiB", "estimate", "estimated GiB", "error", "verdict", "tokens/s"]
    body = []
    for c in comparison:
        est = "" if c["estimate_status"] is None else f"{c['estimate_method']} ({c['estimate_status']})"
        fits = c.get("estimate_level") or ""
        body.append([c["model"], c["label"], c["measured_status"] or "", gib(c["measured_peak_allocated"]), est,
                     gib(c["estimated_peak_allocated"]), "" if c["error_pct"] is None else f"{c['error_pct']:+.1f}%",
                     fits, "" if c["tokens_per_s"] is None else f"{c['tokens_per_s']:.0f}"])
    return head, body


CHAPTER_INTRO = ("The seed chapter's published figures (Colab T4, transformers 4.40; GB = 1024**3 bytes of "
                 "`memory_allocated` after the first optimizer step) beside trainmem's peaks (GiB), and why they differ.")


def markdown(comparison: list[dict[str, Any]], source: str | Path, pngs: dict[str, Path],
             chapter_lines: list[dict[str, Any]] | None = None) -> str:
    """report.md: the comparison, the chapter's published figures beside trainmem's, and links to the plots."""
    head, body = display_rows(comparison)
    lines = [f"# trainmem report: {Path(source).name}", "",
             (f"{len(comparison)} setups. `error` is the estimate's peak_allocated against the measured one "
              "(positive: the estimate is higher)."), "", "## Estimate and measurement", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    if chapter_lines:
        head, body = chapter_display(chapter_lines)
        lines += ["", "## The chapter's published figures", "", CHAPTER_INTRO, "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
    if pngs:
        lines += ["", "## Plots", ""] + [f"![{name}]({path.name})" for name, path in pngs.items()]
    return "\n".join(lines) + "\n"
