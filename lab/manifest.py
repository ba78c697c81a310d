"""The measured sets: which committed measurement file is which set, on which GPU, held out or in-sample, and
where and when each was reported (`lab/sets.json`, read here and nowhere else).

One entry per measurement file of docs/lab/data:

- `file`, `gpu` (the card it ran on), `measured` (the date);
- `memory`: the memory estimator's name for it (`in-sample`, `held-out N`), absent where it is not a memory
  validation set; `reported`: each table of its errors kept as reported, `{at: commit, date, table[, rows]}`;
- `time`: `fit` (the step-time constants are fitted on its rows), `held-out` (never fitted on) or `sharded`
  (one rank of an N-GPU run: not timed by the model); `time_reported`: its step-time table as reported;
- `sharded`: `held-out N` for the FSDP2 ranks measured through the fake process group;
- `liger`: `held-out` for runs with Liger's kernels (`--kernels liger`).

A new measurement file is added here with the commit its estimator was at when it was reported; the docs
generator (`docs`), the step-time fit (`timing`), `benchmarks/docs_estimates.py` and the tests read this list,
so a set is named once.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from . import repository

MANIFEST = Path(__file__).with_name("sets.json")


@functools.lru_cache(maxsize=1)
def sets() -> tuple[dict[str, Any], ...]:
    """Every entry of `lab/sets.json`, oldest measurement first."""
    return tuple(json.loads(MANIFEST.read_text())["sets"])


def path(file: str) -> str:
    """A measurement or table file of docs/lab/data, as a path in this checkout."""
    return str(repository.docs("lab", "data", file))


def memory_sets() -> dict[str, str]:
    """The memory estimator's validation sets: name (`in-sample`, `held-out N`) -> measurement file."""
    return {e["memory"]: e["file"] for e in sets() if "memory" in e}


def gpu(name: str) -> str:
    """The card a memory set ran on (`H200`, `H100`)."""
    return next(e["gpu"] for e in sets() if e.get("memory") == name)


def number(name: str) -> int:
    """A memory set's number: 0 for `in-sample`, N for `held-out N` (the order the docs list them in)."""
    return 0 if name == "in-sample" else int(name.split()[-1])


def reports() -> list[tuple[str, dict[str, Any]]]:
    """(set name, report) of every memory error table kept as reported, by set number then rows."""
    found = [(e["memory"], r) for e in sets() if "memory" in e for r in e.get("reported", [])]
    return sorted(found, key=lambda f: (number(f[0]), f[1].get("rows", "")))


def time_reports() -> list[tuple[str, dict[str, Any]]]:
    """(card, report) of every held-out step-time table kept as reported."""
    return [(e["gpu"], e["time_reported"]) for e in sets() if "time_reported" in e]


def fit_files() -> list[str]:
    """The files whose rows the step-time constants are fitted on (`time: fit`). Named, not globbed, so a new
    measurement file stays held out until it is added here as `fit`."""
    return [e["file"] for e in sets() if e.get("time") == "fit"]


def sharded_reports() -> list[tuple[str, dict[str, Any]]]:
    """Each held-out set of FSDP2 ranks (`held-out N`) with its error table as reported, in the order measured."""
    return [(e["sharded"], e["reported"][0]) for e in sets() if e.get("sharded", "").startswith("held-out")]
