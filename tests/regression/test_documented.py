"""The estimates docs/ shows are the estimator's: recompute them and fail on drift.

docs/data/documented-estimates.jsonl is written by `python benchmarks/docs_estimates.py` together with the
validation tables and report pages; a change to the estimator that moves any figure fails here until the
docs are regenerated. The figures hold for the versions they were made with (recorded in each row):
elsewhere the test skips rather than judge another library's modelling code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate

ROWS = [json.loads(line) for line in
        (Path(__file__).parents[2] / "docs" / "data" / "documented-estimates.jsonl").read_text().splitlines()]


def _minor(v: str) -> str:
    return ".".join(v.split("+")[0].split(".")[:2])


def _same_versions(row: dict) -> bool:
    return (_minor(row["versions"]["torch"]), _minor(row["versions"]["transformers"])) == (
        _minor(torch.__version__), _minor(transformers.__version__))


@pytest.mark.parametrize("method", ["analytic", "simulate"])
def test_documented_estimates_are_the_estimators(method):
    rows = [r for r in ROWS if method in r]  # analytic for every row, simulate for a fixed subset
    assert len(rows) >= (60 if method == "analytic" else 8)
    if not _same_versions(rows[0]):
        pytest.skip(f"documented with torch {rows[0]['versions']['torch']}, transformers "
                    f"{rows[0]['versions']['transformers']}")
    drift = []
    for r in rows:
        b = estimate(ModelSpec.resolve(r["model"]), TrainSetup.from_dict(r["setup"]), method)
        for key, documented in r[method].items():
            if abs(b.memory[key] - documented) > 1e-3 * documented:
                drift.append(f"{r['file']}:{r['row']} {r['model']} {key}: {documented} documented, {b.memory[key]} now")
    assert not drift, "re-run python benchmarks/docs_estimates.py:\n" + "\n".join(drift)
