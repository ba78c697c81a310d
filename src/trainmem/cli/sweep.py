"""Run or estimate a grid of setups, one result row per point, appended to a JSONL file as each finishes.

Any setup flag of `trainmem run` may be a comma list (`--batch-size 4,8,16 --peft none,lora`); `--grid
FILE.yaml` maps fields to lists; `--preset` names a known grid. An `--out` holding rows needs `--resume`, which
skips the points it holds (error rows too, unless `--retry-errors`); points whose estimate is far over `--gpu`
are skipped unless `--force`.
One sweep at a time writes an `--out`; Ctrl-C or SIGTERM keeps the rows made.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trainmem.errors import SetupError
from trainmem.output.render import sweep_line
from trainmem.result import out_problems
from trainmem.search.sweep import (
    METHODS,
    PRESETS,
    Sweep,
    axes,
    expand,
    preset_points,
    resolve,
)

from . import options


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p)
    p.add_argument("--grid", metavar="FILE.yaml", help="a YAML mapping of setup field -> list of values")
    p.add_argument("--preset", help=f"{'|'.join(PRESETS)}: chapter = the seven runs of the tutorial chapter trainmem grew "
                   "from: polyglot-ko-1.3b fine-tuned on a T4")
    p.add_argument("--method", default=None, help=f"{'|'.join(METHODS)} (default both with CUDA, estimate without)")
    options.add_estimator(p, "--estimator", "auto", ": how estimates are made (default auto)")
    p.add_argument("--out", default="trainmem-out/sweep.jsonl", metavar="FILE.jsonl",
                   help="append each point's row here (default trainmem-out/sweep.jsonl); one with rows needs --resume")
    p.add_argument("--resume", action="store_true", help="skip points already in --out and append the others")
    p.add_argument("--retry-errors", action="store_true", help="with --resume: run again points whose row is an error")
    p.add_argument("--force", action="store_true", help="run points whose estimate is far over --gpu anyway")


def main(args: argparse.Namespace) -> int:
    if out_problems(args.out):  # first, alone and at once: where the rows go, not the setup
        raise SetupError(out_problems(args.out))
    problems: list[str] = []
    try:
        sweep = Sweep([], args.out, args.method, args.estimator, args.resume, args.force, args.retry_errors)
    except SetupError as e:
        problems, sweep = e.problems, None
    if sweep is not None and sweep.method == "estimate":  # no point is run: the flags of training alone are unused
        how = "sweep --method estimate" + ("" if args.method else " (the default without CUDA)")
        problems += options.not_used(args, how, options.NOT_USED["estimate"])
    given = {"model": args.model, **options.given_values(args)}
    bases = preset_points(args.preset) if args.preset else [{}]
    points = resolve(expand(axes(given, args.grid, problems), bases), args.config, args.training_args, problems)
    assert sweep is not None  # a bad option raised above, with every other problem
    sweep.points = points
    console = Console(stderr=True)
    for note in sweep.notes():
        console.print(note, style="yellow", markup=False)
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sweep", total=len(points))
        counts = sweep.run(
            starting=lambda label: progress.update(task, description=label),
            made=lambda label, row: progress.console.print(sweep_line(label, row), highlight=False, markup=False),
            point_done=lambda: progress.advance(task),
            warn=lambda text: progress.console.print(text, style="yellow", markup=False, soft_wrap=True))
    console.print(sweep.summary(), highlight=False, soft_wrap=True, markup=False)
    return 1 if counts["error"] else 0
