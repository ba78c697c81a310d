"""Regenerate every estimate that docs/ shows, from the current estimator, in one command:

    python benchmarks/docs_estimates.py [tables] [reports]    # both by default

- docs/data/documented-estimates.jsonl: for each measured row of the validation files below, the
  analytic and simulate `peak_allocated` / `peak_reserved` in bytes; tests/test_documented.py recomputes
  them (analytic for every row, simulate for a fixed subset) and fails when the estimator drifts from
  what the docs say, so a changed estimator must come with regenerated docs;
- docs/data/errors-*.md: the error table of each validation file (benchmarks/compare_estimates.py), which
  docs/estimate-validation.md quotes;
- docs/report-sweep-t4/ and docs/report-chapter/: `trainmem report` pages over the measured rows, with
  their estimate rows recomputed now (the measurements are kept as measured).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import peft
import torch
import transformers

import trainmem
from trainmem.estimator import estimate
from trainmem.report import write_report

VERSIONS = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "docs")
VALIDATION = {  # file -> which set it is (docs/estimate-validation.md, "Held-out protocol")
    "validation-isolated-h200-2026-12-03.jsonl": "in-sample",
    "validation-held-out-h200-2026-12-03.jsonl": "held-out 1",
    "validation-held-out-2-h200-2026-12-03.jsonl": "held-out 2",
    "validation-held-out-3-h200-2026-12-03.jsonl": "held-out 3",
}
REPORTS = {"report-sweep-t4": ("sweep-chapter-t4-h200-2026-12-02.jsonl", "T4"),
           "report-chapter": ("chapter-measured-and-estimated-2026-12-02.jsonl", "T4")}


def documented(kept: list, file: str) -> list[dict]:
    """The figures each validation row's estimates show in docs/, for tests/test_documented.py."""
    out = []
    for i, (r, res) in enumerate(kept):
        row = {"file": file, "row": i, "model": r["model"]["name"], "setup": r["setup"], "versions": VERSIONS}
        for method, b in res.items():
            row[method] = {"peak_allocated": b.memory["peak_allocated"], "peak_reserved": b.memory["peak_reserved"]}
        out.append(row)
    return out


def report(name: str, source: str, gpu: str) -> None:
    """The report page over `source`'s measured rows, each followed by its estimate made now."""
    rows = [json.loads(line) for line in open(os.path.join(DOCS, "data", source))]
    fresh = []
    for r in rows:
        if r["kind"] != "measurement":
            continue
        fresh.append(r)
        b = estimate(r["model"]["name"], trainmem.TrainSetup.from_dict(r["setup"]))
        fresh.append(b.to_result(gpu=r["setup"].get("gpu") or gpu).to_dict())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, source)
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in fresh)
        write_report(path, os.path.join(DOCS, name), gpu)


def main(parts: list[str]) -> int:
    from compare_estimates import compare

    if "reports" in parts:
        for name, (source, gpu) in REPORTS.items():
            report(name, source, gpu)
    if "tables" not in parts:
        return 0
    out = []
    for file, kind in VALIDATION.items():
        kept: list = []
        compare(os.path.join(DOCS, "data", file), os.path.join(DOCS, "data", f"errors-{kind.replace(' ', '-')}.md"), kept)
        out += documented(kept, file)
    with open(os.path.join(DOCS, "data", "documented-estimates.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main(sys.argv[1:] or ["tables", "reports"]))
