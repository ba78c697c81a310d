"""Sweeps: many setups, one result row each, appended as they finish so that a killed sweep resumes.

A sweep is a list of points; a point is a mapping of setup field (or `model`) -> value, in the same
form the setup flags take (text from the command line, typed values from a YAML grid). Expansion is a
pure function (`expand`), so the grid can be checked without running anything; `resolve` turns points
into (spec, setup) pairs through the same validation as `trainmem run`, collecting every problem.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .chapter import MODEL as CHAPTER_MODEL
from .chapter import RUNS as CHAPTER_RUNS
from .errors import SetupError
from .gpus import GPU
from .result import Result
from .setup import TrainSetup
from .specs import ModelSpec

PRESETS = ("chapter",)
METHODS = ("measure", "estimate", "both")
OOM_FACTOR = 1.10
"""A point is skipped as a predicted OOM only when the estimate needs more than this times the card's
capacity: the estimator is validated to a few percent, so anything past 10% would surely fail."""

# --lora-targets is itself a comma list, so on the command line it cannot be an axis (use --grid)
NOT_AXES = ("lora_targets",)


def split_values(text: str) -> list[str]:
    """'4,8,16' -> ['4', '8', '16']; a value without a comma is a one-value axis."""
    return [t.strip() for t in str(text).split(",") if t.strip()]


def expand(axes: dict[str, list[Any]], bases: Iterable[dict[str, Any]] = ({},)) -> list[dict[str, Any]]:
    """Every combination of the axes' values over every base point, in order (last axis fastest).

    >>> expand({"batch_size": [4, 8], "peft": ["none", "lora"]})[1]
    {'batch_size': 4, 'peft': 'lora'}
    """
    names = list(axes)
    return [{**base, **dict(zip(names, combo))}
            for base in bases for combo in itertools.product(*(axes[n] for n in names))]


def preset_points(name: str) -> list[dict[str, Any]]:
    """The base points of a preset: `chapter` is the seed chapter's seven runs on polyglot-ko-1.3b."""
    if name != "chapter":
        raise SetupError([f"--preset: {name!r} is not one of {', '.join(PRESETS)}"])
    default = TrainSetup().to_dict()
    return [{"model": CHAPTER_MODEL, **{k: v for k, v in run.setup.to_dict().items() if v != default[k]}}
            for run in CHAPTER_RUNS]


def read_grid(path: str) -> dict[str, list[Any]]:
    """A YAML mapping of field -> list of values (a scalar is a one-value axis)."""
    import yaml

    try:
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SetupError([f"--grid: cannot read {path!r}: {e}"]) from None
    if not isinstance(loaded, dict):
        raise SetupError([f"--grid: {path!r} must be a mapping of setup field -> list of values"])
    known = set(TrainSetup().to_dict()) | {"model"}
    unknown = [k for k in loaded if str(k).replace("-", "_") not in known]
    if unknown:
        raise SetupError([f"--grid: unknown field {k!r} in {path}; fields are those of `trainmem run --help`"
                          for k in unknown])
    return {str(k).replace("-", "_"): v if isinstance(v, list) else [v] for k, v in loaded.items()}


def axes_from_args(args: argparse.Namespace, fields: Iterable[str]) -> dict[str, list[Any]]:
    """The command line's axes: each given setup flag (and --model) split on commas, then --grid's."""
    axes: dict[str, list[Any]] = {}
    for name in ["model", *fields]:
        given = getattr(args, name, None)
        if given is not None:
            axes[name] = [given] if name in NOT_AXES else split_values(given)
    if getattr(args, "checkpointing", None):
        axes["checkpointing"] = [True]
    if getattr(args, "grid", None):
        grid = read_grid(args.grid)
        both = sorted(set(grid) & set(axes))
        if both:
            raise SetupError([f"--{n.replace('_', '-')}: given both on the command line and in --grid "
                              f"{args.grid}; keep one" for n in both])
        axes.update(grid)
    return axes


def resolve(points: list[dict[str, Any]], args: argparse.Namespace,
            setup_from_args: Any) -> list[tuple[ModelSpec, TrainSetup]]:
    """(spec, setup) for every point through the shared flag parser, each point's values standing in for
    the flags (the other flags, e.g. --config, apply to all); one SetupError with every problem."""
    out: list[tuple[ModelSpec, TrainSetup]] = []
    problems: list[str] = []
    unset = {k: None for k in TrainSetup().to_dict()}
    for i, point in enumerate(points, 1):
        ns = argparse.Namespace(**{**vars(args), **unset, "model": None, **point})
        ns.checkpointing = ns.checkpointing or None
        try:
            out.append(setup_from_args(ns))
        except SetupError as e:
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            problems += [f"point {i} ({where}): {p}" for p in e.problems]
    if problems:
        raise SetupError(problems)
    return out


def resolved_setup(spec: ModelSpec, setup: TrainSetup, kind: str) -> dict[str, Any]:
    """The setup as its result row will record it: device and precision resolved like run/estimate do."""
    device = "cuda" if kind == "estimate" else setup.resolved_device()
    return setup.replace(device=device, precision=setup.resolved_precision(spec, device)).to_dict()


def point_key(kind: str, model: str, setup: dict[str, Any]) -> str:
    """What makes two rows the same point: kind, model name and every resolved setup field."""
    return json.dumps([kind, model, setup], sort_keys=True)


def done_keys(path: str, redo_skipped: bool = False) -> set[str]:
    """Keys of the points a previous sweep already wrote to `path` (for --resume)."""
    p = Path(path)
    if not p.exists():
        return set()
    keys = set()
    for line in p.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill: that point is simply redone
            continue
        if redo_skipped and row.get("status") == "skipped":
            continue
        keys.add(point_key(row["kind"], row["model"]["name"], row["setup"]))
    return keys


def predicted_oom(breakdown: Any, card: GPU, factor: float = OOM_FACTOR) -> bool:
    """True when the estimate's reserved + the card's context exceeds `factor` x its capacity."""
    return breakdown.memory["peak_reserved"] + card.context > factor * card.capacity


def skipped_row(spec: ModelSpec, setup: dict[str, Any], kind: str, breakdown: Any, card: GPU) -> Result:
    """The row of a point not run because its estimate is far over the card; `--force` runs it anyway."""
    need = breakdown.memory["peak_reserved"] + card.context
    note = (f"skipped as a predicted OOM: the estimate needs {need / 2**30:.2f} GiB (reserved + context), more "
            f"than {OOM_FACTOR:.2f} x the {card.name}'s {card.capacity / 2**30:.2f} GiB; pass --force to run it")
    if kind == "estimate":
        row = breakdown.to_result(card.name)
    else:
        row = Result(kind="measurement", status="skipped", setup=setup, model=spec.describe(),
                     effective_batch=setup["batch_size"] * setup["grad_accum"] * setup.get("gpus", 1))
    row.status = "skipped"
    row.notes.append(note)
    return row


__all__ = ["expand", "split_values", "preset_points", "read_grid", "axes_from_args", "resolve",
           "resolved_setup", "point_key", "done_keys", "predicted_oom", "skipped_row", "METHODS", "PRESETS"]
