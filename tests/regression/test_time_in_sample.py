"""The in-sample step-time table the docs link (docs/data/time-in-sample.md) is the step-time model's, for the
versions it was made with (the model's checks derived by hand are tests/unit/test_timing.py)."""

from __future__ import annotations

import pytest


def test_documented_step_times_are_the_time_models():
    """docs/data/time-in-sample.md (every in-sample row, predicted at the committed constants) is the
    model's: every tenth row is recomputed from its measurement in docs/lab/data and must match to the 0.1 ms the
    table prints. Kernel counts follow the modeling code, so the check holds for the versions the table was
    made with (said above the table) and skips elsewhere."""
    import glob
    import os
    import re

    import torch
    import transformers

    from lab import timing as time_validate

    if (torch.__version__.split("+")[0], transformers.__version__) != ("2.13.0", "5.17.0"):
        pytest.skip("the table was made with torch 2.13.0 and transformers 5.17.0")
    root = os.path.join(os.path.dirname(__file__), "..", "..")

    last = open(os.path.join(root, "docs", "data", "time-in-sample.md")).read()
    documented = [(m.group(1), float(m.group(2)), float(m.group(3)))
                  for m in re.finditer(r"^\| (.+?) \| ([\d.]+) \| ([\d.]+) \| [+-]\d+% \|$", last, re.M)]
    assert len(documented) > 300
    found = {(time_validate.label(r), round(time_validate.measured_s(r) * 1e3, 1)): r
             for _, r in time_validate.rows(sorted(glob.glob(os.path.join(root, "docs", "lab", "data", "*.jsonl"))))}
    drift = []
    for label, measured, predicted in documented[::10]:
        now = time_validate.predict(found[(label, measured)]) * 1e3
        if abs(now - predicted) > max(0.051, 1e-3 * predicted):
            drift.append(f"{label}: {predicted} ms documented, {now:.1f} ms now")
    assert not drift, "re-run python benchmarks/time_validate.py compare docs/lab/data/*.jsonl:\n" + "\n".join(drift)
