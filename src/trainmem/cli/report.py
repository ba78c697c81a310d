"""Turn a JSONL file of result rows (run, estimate, sweep) into tables, plots and one HTML page.

Writes DIR/report.md, DIR/report.csv, DIR/*.png and DIR/report.html: each setup's measurement and
estimate side by side with the estimate's error on peak_allocated.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from trainmem.errors import SetupError
from trainmem.hardware.gpus import gpu_problem
from trainmem.result import Unreadable, folder_problem, unreadable_note


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.jsonl", help="result rows, e.g. from trainmem sweep --out")
    p.add_argument("--out", default="trainmem-out/report", metavar="DIR", help="where to write (default trainmem-out/report)")
    p.add_argument("--gpu", default=None, help="draw this card's capacity on the breakdown plot")


def main(args: argparse.Namespace) -> int:
    from trainmem.output.report import plots, write_report

    problems = []
    if not Path(args.file).is_file():
        problems.append(f"FILE.jsonl: no such file {args.file!r}; pass the --out file of trainmem sweep/run/estimate")
    if args.gpu and gpu_problem(args.gpu):
        problems.append(gpu_problem(args.gpu))
    problems += [p for p in [folder_problem(args.out, "--out")] if p]
    if problems:
        raise SetupError(problems)
    unreadable: list[Unreadable] = []
    try:
        written = write_report(args.file, args.out, args.gpu, unreadable)
    except ValueError as e:
        raise SetupError([f"FILE.jsonl: {e}"]) from None
    if unreadable:
        Console(stderr=True).print(f"warning: {unreadable_note(unreadable)}", style="yellow", markup=False,
                                   soft_wrap=True)
    console = Console()
    if not plots.available():
        console.print(plots.MISSING, style="yellow", markup=False)  # not markup: [report] is text
    for name, path in written.items():
        console.print(f"{name}: {path}", highlight=False)
    return 0
