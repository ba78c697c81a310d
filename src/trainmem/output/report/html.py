"""One self-contained HTML page: the comparison table and the plots inlined as base64 PNG, so the
file can be mailed or attached to an issue and still show everything."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

from .plots import MISSING
from .tables import CHAPTER_INTRO, chapter_display, display_rows

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:75em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em}
td.num{text-align:right;font-variant-numeric:tabular-nums}img{max-width:100%;display:block;margin:1em 0}"""
# records on <body> how many plots the browser decoded, so a headless browser can check the inlined PNGs
DECODED = ("<script>addEventListener('load',()=>{document.body.dataset.decodedPlots="
           "[...document.images].filter(i=>i.naturalWidth>0).length})</script>")
NUMERIC = {"measured GiB", "estimated GiB", "error", "tokens/s"}


def table(comparison: list[dict[str, Any]], cells_of: Any = display_rows, id_: str = "comparison-table") -> str:
    """The comparison as an HTML table (the page's only table markup; cells escaped)."""
    head, body = cells_of(comparison)
    cls = ["num" if h in NUMERIC else "" for h in head]
    rows = ["<tr>" + "".join(f'<td class="{c}">{escape(v)}</td>' for c, v in zip(cls, cells)) + "</tr>"
            for cells in body]
    return (f'<table id="{id_}"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def page(comparison: list[dict[str, Any]], source: str | Path, pngs: dict[str, Path],
         chapter_lines: list[dict[str, Any]] | None = None) -> str:
    """One self-contained HTML page: the comparison, the chapter's figures and the plots inlined as base64 PNGs."""
    title = f"trainmem report: {Path(source).name}"
    images = "".join(f'<figure id="plot-{escape(name)}"><img alt="{escape(name)}" src="data:image/png;base64,'
                     f'{base64.b64encode(path.read_bytes()).decode()}"></figure>' for name, path in pngs.items())
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f'<section id="summary"><p>{len(comparison)} setups. <em>error</em> is the estimate\'s peak_allocated '
            "against the measured one (positive: the estimate is higher).</p></section>"
            f'<section id="comparison"><h2>Estimate and measurement</h2>{table(comparison)}</section>'
            + (f'<section id="chapter"><h2>The chapter\'s published figures</h2><p>{escape(CHAPTER_INTRO)}</p>'
               f'{table(chapter_lines, chapter_display, "chapter-table")}</section>' if chapter_lines else "")
            + f'<section id="plots"><h2>Plots</h2>{images or "<p>" + escape(MISSING) + "</p>"}</section>'
            f"{DECODED}</body></html>\n")
