"""Reports from result rows: tables (markdown, CSV), PNG plots and one self-contained HTML page.

Torch-free on purpose: a report is made wherever the JSONL lands (a laptop, CI), so this package reads
plain rows and never imports the estimator or the runner. matplotlib is optional (`trainmem[report]`):
without it the tables and the page are written, the plots are not, and `plots.MISSING` says why.
"""

from __future__ import annotations

from pathlib import Path

from trainmem.result import Unreadable, unreadable_note
from trainmem.result import read_rows as load_rows

from . import html, plots, tables


def write_report(source: str | Path, out: str | Path, gpu: str | None = None,
                 unreadable: list[Unreadable] | None = None) -> dict[str, Path]:
    """Write report.md, report.csv, the PNG plots and report.html under `out`; returns name -> path. The
    lines of `source` that are not result rows are left out, and added to `unreadable` when it is a list."""
    unreadable = [] if unreadable is None else unreadable
    rows = load_rows(source, unreadable)
    if not rows:
        why = f"; {unreadable_note(unreadable)}" if unreadable else ""
        raise ValueError(f"{source}: no trainmem result rows (one JSON object per line, schema "
                         f"trainmem.result/1){why}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    comparison = tables.compare(rows)
    written = {"csv": out / "report.csv", "md": out / "report.md"}
    tables.write_csv(comparison, written["csv"])
    pngs = plots.write_all(rows, out, gpu)
    chapter = tables.chapter(rows)
    written["md"].write_text(tables.markdown(comparison, source, pngs, chapter), encoding="utf-8")
    written.update(pngs)
    written["html"] = out / "report.html"
    written["html"].write_text(html.page(comparison, source, pngs, chapter), encoding="utf-8")
    return written


__all__ = ["load_rows", "write_report", "tables", "plots", "html"]
