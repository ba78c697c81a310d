"""The result object: one row per experiment, the same schema for measurements and estimates.

`memory` is the composition at the peak: `weights + gradients + optimizer + activations + other ==
peak_allocated`, each the bytes of that kind live at the moment of the peak. `model_states` holds the
seed's figures, the sizes of weights, gradients and optimizer states after an optimizer step (always
defined: zero where a run died before they existed). All sizes are bytes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "trainmem.result/1"
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "other",
               "peak_allocated", "peak_reserved", "device_used")
STATUSES = ("ok", "oom", "error", "skipped")


def empty_memory() -> dict[str, int]:
    return {k: 0 for k in MEMORY_KEYS}


@dataclass
class Result:
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
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} row: schema={d.get('schema')!r}")
        return cls(**d)

    def append_to(self, path: str) -> None:
        """Append as one JSON line; the file is opened per row so a killed sweep keeps what it had."""
        with open(path, "a", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")
