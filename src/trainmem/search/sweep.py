"""Sweeps: many setups, one result row each, appended as they finish so that a killed sweep resumes.

A sweep is a list of points; a point is a mapping of setup field (or `model`) -> value, in the same
form the setup flags take (text from the command line, typed values from a YAML grid). Expansion is a
pure function (`expand`), so the grid can be checked without running anything; `resolve` turns points
into (spec, setup) pairs through the same sources and validation as `trainmem run`
(`trainmem.config.sources.load_setup`), collecting every problem. `Sweep` then measures or estimates each
point, skipping what `resume` finds done and what the estimate says cannot fit.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmem.config.chapter import MODEL as CHAPTER_MODEL
from trainmem.config.chapter import RUNS as CHAPTER_RUNS
from trainmem.config.setup import ESTIMATORS, TrainSetup
from trainmem.config.sources import load_setup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.hardware.gpus import GPU
from trainmem.result import Result, read_rows

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


def axes(given: dict[str, Any], grid: str | None = None) -> dict[str, list[Any]]:
    """The axes of a sweep: each given value (field or `model` -> text, as the flags hold it) split on
    commas, `checkpointing` given as a one-value axis [True], then the YAML `grid`'s axes; a field in
    both is a problem."""
    out: dict[str, list[Any]] = {}
    for name, value in given.items():
        if value is not None:
            out[name] = [True] if name == "checkpointing" else [value] if name in NOT_AXES else split_values(value)
    if grid:
        from_grid = read_grid(grid)
        both = sorted(set(from_grid) & set(out))
        if both:
            raise SetupError([f"--{n.replace('_', '-')}: given both on the command line and in --grid "
                              f"{grid}; keep one" for n in both])
        out.update(from_grid)
    return out


def resolve(points: list[dict[str, Any]], config: str | None = None, training_args: str | None = None,
            problems: list[str] | None = None) -> list[tuple[ModelSpec, TrainSetup]]:
    """(spec, setup) for every point, its values standing in for the setup flags (`config` and
    `training_args` apply to all); one SetupError with every problem, the caller's `problems` included."""
    out: list[tuple[ModelSpec, TrainSetup]] = []
    problems = list(problems or [])
    for i, point in enumerate(points, 1):
        try:
            out.append(load_setup(point.get("model"), {k: v for k, v in point.items() if k != "model"},
                                  config, training_args))
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
    if not Path(path).exists():
        return set()
    return {point_key(row["kind"], row["model"]["name"], row["setup"]) for row in read_rows(path)
            if not (redo_skipped and row.get("status") == "skipped")}


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
                     effective_batch=TrainSetup.from_dict(setup).effective_batch)
    row.status = "skipped"
    row.notes.append(note)
    return row


@dataclass
class Sweep:
    """Points measured, estimated or both, in order; each row appended to `out` as it is made, so that a
    killed sweep keeps what it had and `resume` goes on from there. Bad options raise one SetupError."""

    points: list[tuple[ModelSpec, TrainSetup]]
    out: str
    method: str | None = None
    """`measure`, `estimate` or `both`; None: both with CUDA, estimate without."""
    estimator: str = "auto"
    """How estimates are made (`trainmem.estimate`'s method)."""
    resume: bool = False
    """Skip points whose rows `out` already holds."""
    force: bool = False
    """Run points whose estimate is far over their `gpu` (`predicted_oom`) instead of skipping them."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("ok", "oom", "error", "skipped", "resumed"), 0))

    def __post_init__(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        self.method = self.method or ("both" if self.cuda else "estimate")
        problems = [f"--{flag}: {value!r} is not one of {', '.join(allowed)}" for flag, value, allowed in
                    (("method", self.method, METHODS), ("estimator", self.estimator, ESTIMATORS))
                    if value not in allowed]
        if problems:
            raise SetupError(problems)

    def notes(self) -> list[str]:
        """What to say before the sweep starts: measuring was asked for where there is no CUDA."""
        if self.method in ("measure", "both") and not self.cuda and any(s.device != "cpu" for _, s in self.points):
            return [f"No CUDA device here: --method {self.method} estimates instead of measuring "
                    "(pass --device cpu to measure on the CPU)."]
        return []

    def run(self, starting: Callable[[str], None] = lambda label: None,
            made: Callable[[str, Result], None] = lambda label, row: None,
            point_done: Callable[[], None] = lambda: None) -> dict[str, int]:
        """Make every row; returns the counts by status (and `resumed`). `starting(label)` is called before
        a row is made, `made(label, row)` once it is written, `point_done()` after each point."""
        from trainmem.estimator import estimate
        from trainmem.hardware.gpus import find_gpu
        from trainmem.isolation.runner import run

        Path(self.out).parent.mkdir(parents=True, exist_ok=True)
        done = done_keys(self.out, redo_skipped=self.force) if self.resume else set()
        measure_all = self.method in ("measure", "both")
        for spec, setup in self.points:
            measured = measure_all and (self.cuda or setup.device == "cpu")
            kinds = (["estimate"] if self.method == "both" or not measured else []) + (["measurement"] if measured else [])
            card = find_gpu(setup.gpu) if setup.gpu else None
            breakdown = None
            for kind in kinds:
                resolved = resolved_setup(spec, setup, kind)
                label = f"{spec.name} b{setup.batch_size} {setup.peft}{' ckpt' if setup.checkpointing else ''} {kind}"
                if point_key(kind, spec.name, resolved) in done:
                    self.counts["resumed"] += 1
                    continue
                starting(label)
                if breakdown is None and (kind == "estimate" or card is not None):
                    breakdown = estimate(spec, setup, self.estimator)
                if card is not None and not self.force and predicted_oom(breakdown, card):
                    row = skipped_row(spec, resolved, kind, breakdown, card)
                elif kind == "estimate":
                    row = breakdown.to_result(setup.gpu)
                else:
                    row = run(spec, setup)
                row.append_to(self.out)
                self.counts[row.status] += 1
                made(label, row)
            point_done()
        return self.counts


__all__ = ["Sweep", "expand", "split_values", "preset_points", "read_grid", "axes", "resolve",
           "resolved_setup", "point_key", "done_keys", "predicted_oom", "skipped_row", "METHODS", "PRESETS"]
