"""Run or estimate a grid of setups, one result row per point, appended to a JSONL file as each finishes.

Any setup flag of `trainmem run` may be a comma list (`--batch-size 4,8,16 --peft none,lora`); `--grid
FILE.yaml` maps fields to lists; `--preset chapter` is the seed chapter's seven runs. Points already in
`--out` are skipped with `--resume`; points whose estimate is far over `--gpu` are skipped unless `--force`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..errors import SetupError
from ..estimator import METHODS as ESTIMATORS
from ..estimator import estimate
from ..gpus import find_gpu
from ..runner import run
from ..sweep import (
    METHODS,
    PRESETS,
    axes_from_args,
    done_keys,
    expand,
    point_key,
    predicted_oom,
    preset_points,
    resolve,
    resolved_setup,
    skipped_row,
)
from .options import SETUP_FLAGS, add_setup_arguments, setup_from_args


def register(p: argparse.ArgumentParser) -> None:
    add_setup_arguments(p)
    p.add_argument("--grid", metavar="FILE.yaml", help="a YAML mapping of setup field -> list of values")
    p.add_argument("--preset", help=f"{'|'.join(PRESETS)}: chapter = the seed chapter's seven runs on polyglot-ko-1.3b")
    p.add_argument("--method", default=None, help=f"{'|'.join(METHODS)} (default both with CUDA, estimate without)")
    p.add_argument("--estimator", default="auto", help=f"{'|'.join(ESTIMATORS)}: how estimates are made (default auto)")
    p.add_argument("--out", default="trainmem-out/sweep.jsonl", metavar="FILE.jsonl",
                   help="append each point's row here (default trainmem-out/sweep.jsonl)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--force", action="store_true", help="run points whose estimate is far over --gpu anyway")


def main(args: argparse.Namespace) -> int:
    import torch

    cuda = torch.cuda.is_available()
    method = args.method or ("both" if cuda else "estimate")
    problems = []
    if method not in METHODS:
        problems.append(f"--method: {method!r} is not one of {', '.join(METHODS)}")
    if args.estimator not in ESTIMATORS:
        problems.append(f"--estimator: {args.estimator!r} is not one of {', '.join(ESTIMATORS)}")
    if problems:
        raise SetupError(problems)
    fields = [name for name, _, _ in SETUP_FLAGS.values()]
    bases = preset_points(args.preset) if args.preset else [{}]
    points = resolve(expand(axes_from_args(args, fields), bases), args, setup_from_args)
    console = Console(stderr=True)
    measure_all = method in ("measure", "both")
    if measure_all and not cuda and any(s.device != "cpu" for _, s in points):
        console.print(f"[yellow]No CUDA device here: --method {method} estimates instead of measuring "
                      "(pass --device cpu to measure on the CPU).[/yellow]")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    done = done_keys(args.out, redo_skipped=args.force) if args.resume else set()
    counts = {"ok": 0, "oom": 0, "error": 0, "skipped": 0, "resumed": 0}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sweep", total=len(points))
        for spec, setup in points:
            measured = measure_all and (cuda or setup.device == "cpu")
            kinds = (["estimate"] if method == "both" or not measured else []) + (["measurement"] if measured else [])
            card = find_gpu(setup.gpu) if setup.gpu else None
            breakdown = None
            for kind in kinds:
                resolved = resolved_setup(spec, setup, kind)
                label = f"{spec.name} b{setup.batch_size} {setup.peft}{' ckpt' if setup.checkpointing else ''} {kind}"
                if point_key(kind, spec.name, resolved) in done:
                    counts["resumed"] += 1
                    continue
                progress.update(task, description=label)
                if breakdown is None and (kind == "estimate" or card is not None):
                    breakdown = estimate(spec, setup, args.estimator)
                if card is not None and not args.force and predicted_oom(breakdown, card):
                    row = skipped_row(spec, resolved, kind, breakdown, card)
                elif kind == "estimate":
                    row = breakdown.to_result(setup.gpu)
                else:
                    row = run(spec, setup)
                row.append_to(args.out)
                counts[row.status] += 1
                progress.console.print(f"{label}: {row.status}, peak_allocated "
                                       f"{row.memory['peak_allocated'] / 2**30:.3f} GiB", highlight=False)
            progress.advance(task)
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    console.print(f"{len(points)} points ({summary or 'nothing to do'}) -> {args.out}", highlight=False)
    return 1 if counts["error"] else 0
