"""Sweeps: many setups, one result row each, appended as they finish so that a killed sweep resumes.

A sweep is a list of points; a point is a mapping of setup field (or `model`) -> value, in the same
form the setup flags take (text from the command line, typed values from a YAML grid). Expansion is a
pure function (`expand`), so the grid can be checked without running anything; `resolve` turns points
into (spec, setup) pairs through the same sources and validation as `trainmem run`
(`trainmem.config.sources.load_setup`), collecting every problem. `Sweep` then measures or estimates each
point, skipping what `resume` finds done and what the estimate says cannot fit.

Nothing is lost: `out` is checked before any work; one sweep at a time writes it (`trainmem.result.OutLock`,
held for the whole sweep: a second one stops at once); a line cut by a killed sweep is moved aside before
rows are added after it; each row is on disk, whole, before the next point starts; an interrupted sweep
(Ctrl-C, SIGTERM) stops its worker and says how far it got.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trainmem.config.chapter import MODEL as CHAPTER_MODEL
from trainmem.config.chapter import RUNS as CHAPTER_RUNS
from trainmem.config.setup import ESTIMATORS, TrainSetup
from trainmem.config.sources import load_setup
from trainmem.config.specs import ModelSpec
from trainmem.errors import Interrupted, SetupError
from trainmem.hardware.gpus import GPU
from trainmem.result import (
    OutLock,
    Result,
    Unreadable,
    append_line,
    out_problems,
    read_rows,
    repair_tail,
    unreadable_note,
)

PRESETS = ("chapter",)
METHODS = ("measure", "estimate", "both")
OOM_FACTOR = 1.10
"""A point is skipped as a predicted OOM only when the estimate needs more than this times the card's
capacity: the estimator is validated to a few percent, so anything past 10% would surely fail."""

# --lora-targets is itself a comma list, so on the command line it cannot be an axis (use --grid)
NOT_AXES = ("lora_targets",)


def split_values(text: str) -> list[str]:
    """'4,8,16' -> ['4', '8', '16']; a value without a comma is a one-value axis. An empty item ('2,,4', '2,4,')
    is a ValueError naming it: a value left out, which the grid must not silently lose."""
    items = [t.strip() for t in str(text).split(",")]
    if len(items) > 1 and not all(items):
        at = [i for i, t in enumerate(items, 1) if not t]
        raise ValueError(f"{text!r} has an empty item (item {', '.join(map(str, at))} of {len(items)}); put one value "
                         f"between commas, e.g. {','.join(t for t in items if t) or '4,8'}")
    return items


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
    return [{"model": CHAPTER_MODEL, "peft": run.setup.peft,  # every point says its peft (see `resolve`)
             **{k: v for k, v in run.setup.to_dict().items() if v != default[k]}} for run in CHAPTER_RUNS]


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


def axes(given: dict[str, Any], grid: str | None = None, problems: list[str] | None = None) -> dict[str, list[Any]]:
    """The axes of a sweep: each given value (field or `model` -> text, as the flags hold it) split on
    commas, `checkpointing` given as a one-value axis [True], then the YAML `grid`'s axes; a field in
    both is a problem. A comma list with an empty item is a problem: added to `problems` (the axis left
    out, so that the rest is checked too) where it is given, else raised."""
    out: dict[str, list[Any]] = {}
    found: list[str] = []
    for name, value in given.items():
        if value is None:
            continue
        try:
            out[name] = [True] if name == "checkpointing" else [value] if name in NOT_AXES else split_values(value)
        except ValueError as e:
            found.append(f"--{name.replace('_', '-')}: {e}")
    if found and problems is None:
        raise SetupError(found)
    if found:
        problems += found  # type: ignore[operator]
    if grid:
        from_grid = read_grid(grid)
        both = sorted(set(from_grid) & set(out))
        if both:
            raise SetupError([f"--{n.replace('_', '-')}: given both on the command line and in --grid "
                              f"{grid}; keep one" for n in both])
        out.update(from_grid)
    return out


LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets", "lora_experts")


def resolve(points: list[dict[str, Any]], config: str | None = None, training_args: str | None = None,
            problems: list[str] | None = None) -> list[tuple[ModelSpec, TrainSetup]]:
    """(spec, setup) for every point, its values standing in for the setup flags (`config` and
    `training_args` apply to all); one SetupError with every problem, the caller's `problems` included.

    A grid's LoRA values (`--peft none,lora --lora-r 8,16`) are for its LoRA points: a point that says
    `peft: none` takes none of them, and is made once. LoRA values no point can use are a problem."""
    out: list[tuple[ModelSpec, TrainSetup]] = []
    problems = list(problems or [])
    seen: set[str] = set()
    left_out: dict[str, None] = {}  # the LoRA fields left out of `peft: none` points, in order
    kept: set[str] = set()  # those of the other points
    for i, point in enumerate(points, 1):
        values = {k: v for k, v in point.items() if k != "model"}
        lora = [k for k in LORA_FIELDS if k in values]
        if str(values.get("peft")).strip() == "none":
            left_out.update(dict.fromkeys(lora))
            values = {k: v for k, v in values.items() if k not in LORA_FIELDS}
        else:
            kept.update(lora)
        key = json.dumps([point.get("model"), values], sort_keys=True, default=repr)
        if key in seen:
            continue
        seen.add(key)
        try:
            out.append(load_setup(point.get("model"), values, config, training_args))
        except SetupError as e:
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            problems += [f"point {i} ({where}): {p}" for p in e.problems]
    problems += [f"--{name.replace('_', '-')}: applies to --peft lora or qlora, and no point of the sweep has one; "
                 f"add lora to --peft or drop --{name.replace('_', '-')}" for name in left_out if name not in kept]
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


def done_keys(path: str, redo_skipped: bool = False, problems: list[Unreadable] | None = None,
              redo_errors: bool = False) -> set[str]:
    """Keys of the points a previous sweep already wrote to `path` (for --resume), but those whose row is
    `skipped` with `redo_skipped` and `error` with `redo_errors`; lines that are not rows go to `problems`."""
    if not Path(path).exists():
        return set()
    redo = {"skipped"} if redo_skipped else set()
    redo |= {"error"} if redo_errors else set()
    return {point_key(row["kind"], row["model"]["name"], row["setup"]) for row in read_rows(path, problems)
            if row["status"] not in redo}


def predicted_oom(breakdown: Any, card: GPU, factor: float = OOM_FACTOR) -> bool:
    """True when what the estimate says the card must hold (its verdict's need: peak reserved + the setup's
    memory outside the allocator) exceeds `factor` x its capacity."""
    return breakdown.verdict(card)["need"] > factor * card.capacity


def skipped_row(spec: ModelSpec, setup: dict[str, Any], kind: str, breakdown: Any, card: GPU) -> Result:
    """The row of a point not run because its estimate is far over the card; `--force` runs it anyway."""
    need = breakdown.verdict(card)["need"]
    note = (f"skipped as a predicted OOM: the estimate needs {need / 2**30:.2f} GiB (reserved + memory outside "
            "the allocator), more "
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
    """Skip points whose rows `out` already holds (`error` rows included, unless `retry_errors`)."""
    force: bool = False
    """Run points whose estimate is far over their `gpu` (`predicted_oom`) instead of skipping them."""
    retry_errors: bool = False
    """With `resume`: run again points whose row in `out` is an `error` (they count as done otherwise)."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("ok", "oom", "error", "skipped", "resumed"), 0))

    def __post_init__(self) -> None:
        problems = out_problems(self.out)  # where the rows go: checked before any work
        if not problems and not self.resume and Path(self.out).is_file() and Path(self.out).stat().st_size:
            problems.append(self.not_empty())
        if self.retry_errors and not self.resume:
            problems.append("--retry-errors: reruns the error rows of a resumed sweep; add --resume")
        self.method = self.method or ("both" if self.cuda else "estimate")
        problems += [f"--{flag}: {value!r} is not one of {', '.join(allowed)}" for flag, value, allowed in
                     (("method", self.method, METHODS), ("estimator", self.estimator, ESTIMATORS))
                     if value not in allowed]
        if problems:
            raise SetupError(problems)

    def not_empty(self) -> str:
        """The problem of a sweep without `resume` into an `out` that holds rows: it would append its points again."""
        with open(self.out, "rb") as f:
            lines = sum(1 for line in f if line.strip())
        return (f"--out: {self.out} already holds {lines} line{'s' if lines != 1 else ''}; a sweep without --resume "
                "would append its points again: add --resume to skip the points it holds, or pass a new --out")

    @cached_property
    def cuda(self) -> bool:
        """Whether this process sees a CUDA device (asked once, when first needed: it loads torch)."""
        import torch

        return torch.cuda.is_available()

    def notes(self) -> list[str]:
        """What to say before the sweep starts: measuring was asked for where there is no CUDA."""
        if self.method in ("measure", "both") and not self.cuda and any(s.device != "cpu" for _, s in self.points):
            return [f"No CUDA device here: --method {self.method} estimates instead of measuring "
                    "(pass --device cpu to measure on the CPU)."]
        return []

    def run(self, starting: Callable[[str], None] = lambda label: None,
            made: Callable[[str, Result], None] = lambda label, row: None,
            point_done: Callable[[], None] = lambda: None,
            warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> dict[str, int]:
        """Make every row; returns the counts by status (and `resumed`). `starting(label)` is called before
        a row is made, `made(label, row)` once it is written, `point_done()` after each point (resumed ones
        too), `warn(text)` for what was found in `out` (a cut last line moved aside, unreadable lines).

        Holds `out`'s lock throughout: SetupError at once when another sweep has it. Interrupted (Ctrl-C,
        or `Interrupted` from a signal), raises `Interrupted` saying how many points were done."""
        Path(self.out).parent.mkdir(parents=True, exist_ok=True)
        lock = OutLock(self.out)
        if not lock.acquire():
            raise SetupError([lock.busy()])
        finished = 0

        def done_one() -> None:
            nonlocal finished
            finished += 1
            point_done()

        try:
            moved = repair_tail(self.out)
            if moved:
                warn(f"warning: {moved}")
            unreadable: list[Unreadable] = []
            done = done_keys(self.out, self.force, unreadable, self.retry_errors) if self.resume else set()
            if unreadable:
                warn(f"warning: {unreadable_note(unreadable)}; their points are run again")
            self._make_rows(done, starting, made, done_one)
        except KeyboardInterrupt as e:
            raise Interrupted(getattr(e, "signum", signal.SIGINT), f"interrupted after {finished} of "
                              f"{len(self.points)} points; rerun with --resume") from None
        finally:
            lock.release()
        return self.counts

    def summary(self) -> str:
        """The closing line: `N run (.. ok, .. oom), K resumed, E errors -> FILE` (and what was skipped)."""
        c = self.counts
        made = c["ok"] + c["oom"] + c["error"]
        how = f" ({c['ok']} ok, {c['oom']} oom)" if c["oom"] else ""
        skipped = f", {c['skipped']} skipped as predicted OOMs" if c["skipped"] else ""
        return (f"{len(self.points)} points: {made} run{how}{skipped}, {c['resumed']} resumed, "
                f"{c['error']} errors -> {self.out}")

    def _make_rows(self, done: set[str], starting: Callable[[str], None],
                   made: Callable[[str, Result], None], point_done: Callable[[], None]) -> None:
        """Every point's rows, each appended to `out` (whose lock `run` holds) before the next is made."""
        from trainmem.estimator import estimate
        from trainmem.hardware.gpus import find_gpu
        from trainmem.isolation.runner import run

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
                    if row.status == "error":  # a dead worker's row holds the setup unresolved: key it as resume will
                        row.setup = resolved
                append_line(self.out, row.to_json())
                self.counts[row.status] += 1
                made(label, row)
            point_done()


__all__ = ["Sweep", "expand", "split_values", "preset_points", "read_grid", "axes", "resolve",
           "resolved_setup", "point_key", "done_keys", "predicted_oom", "skipped_row", "METHODS", "PRESETS"]
