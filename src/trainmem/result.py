"""The result object: one row per experiment, the same schema for measurements and estimates.

`memory` is the composition at the peak, each part the bytes of that kind live at the moment of the peak.
`weights + gradients + optimizer + activations + other == peak_allocated` on the CPU (the ledger's peak), and
on CUDA while the parts live in PyTorch's allocator: paged 8-bit AdamW's states live in CUDA managed memory,
counted in `optimizer` but not in the allocator's `peak_allocated`, so there the parts can exceed it. `model_states` holds the
seed's figures, the sizes of weights, gradients and optimizer states after an optimizer step (always
defined: zero where a run died before they existed). All sizes are bytes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "trainmem.result/1"
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "other",
               "peak_allocated", "peak_reserved", "device_used")


def empty_memory() -> dict[str, int]:
    """Every memory key at zero: the composition of a run that died before it measured anything."""
    return {k: 0 for k in MEMORY_KEYS}


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The result rows of a JSONL file, as dicts; lines cut short by a killed sweep, and lines that are
    not trainmem result rows, are left out. The one reader of result files (report, sweep's resume)."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and str(row.get("schema", "")).startswith("trainmem.result/"):
            rows.append(row)
    return rows


@dataclass
class Result:
    """One experiment's row, measured or estimated: the same schema for both so that they sit side by side."""
    kind: str
    """`measurement` (trainmem run) or `estimate`."""
    status: str
    """`ok`, `oom` (a result, not a crash) or `error` (the run itself failed; see `error`)."""
    setup: dict[str, Any]
    """Every resolved setting, so the row can be reproduced."""
    model: dict[str, Any]
    memory: dict[str, int] = field(default_factory=empty_memory)
    model_states: dict[str, int] = field(default_factory=lambda: {"weights": 0, "gradients": 0, "optimizer": 0})
    phases: list[dict[str, Any]] = field(default_factory=list)
    throughput: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    effective_batch: int = 0
    steps_done: int = 0
    peak_phase: str = ""
    """The phase in which the peak happened, e.g. `step2.micro1.backward` or `step1.optimizer`."""
    losses: list[float] = field(default_factory=list)
    oom: dict[str, Any] | None = None
    """For status `oom`: the phase, the bytes it tried to allocate, the peak reached."""
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    method: str | None = None
    """For estimates: `analytic` or `simulate`."""
    terms: dict[str, int] = field(default_factory=dict)
    """For estimates: the named terms behind the breakdown."""
    verdict: dict[str, Any] | None = None
    """For estimates with a card: fits, headroom in bytes, the component to cut first."""
    time: dict[str, Any] = field(default_factory=dict)
    """For estimates: the predicted step time (step_s, tokens_per_s, mfu) on the modelled card."""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """Multi-process runs: per rank its `memory` and `model_states`; the top level is the worst rank."""
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """The row as plain data (what the JSONL line holds)."""
        return asdict(self)

    def to_json(self) -> str:
        """The row as one JSON line; NaN losses are kept (pure fp16 overflows)."""
        return json.dumps(self.to_dict(), allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        """A row read back; refuses a row of another schema rather than misreading it."""
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} row: schema={d.get('schema')!r}")
        return cls(**d)

    def append_to(self, path: str) -> None:
        """Append as one JSON line; the file is opened per row so a killed sweep keeps what it had."""
        with open(path, "a", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")
