"""An experiment as plain JSON, for the process that runs it (the isolated worker, each gloo rank).

Torch-free, so that the parent of an isolated run writes its job without importing torch.
"""

from __future__ import annotations

from typing import Any

from .setup import TrainSetup
from .specs import ModelSpec


def to_job(spec: ModelSpec, setup: TrainSetup, **more: Any) -> dict[str, Any]:
    """The spec (what it is, not what it was resolved from) and the setup, plus any `more` fields."""
    return {"spec": {"name": spec.name, "config": spec.config, "source": spec.source, "path": spec.path},
            "setup": setup.to_dict(), **more}


def from_job(job: dict[str, Any]) -> tuple[ModelSpec, TrainSetup]:
    """The spec and setup `to_job` wrote (the setup's fields checked against TrainSetup's)."""
    return ModelSpec(**job["spec"]), TrainSetup.from_dict(job["setup"])
