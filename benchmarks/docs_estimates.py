"""Regenerate every estimate that docs/ shows, from the current estimator, in one command:

    python benchmarks/docs_estimates.py [documented] [reports] [tables]    # all three by default

The measurements themselves are in docs/lab/data/ (dated, never rewritten); what this script writes is in
docs/data/ and docs/report-*/, and changes with the estimator.

- docs/data/documented-estimates.jsonl: for each measured row of the validation files below, the
  analytic and simulate `peak_allocated` / `peak_reserved` in bytes; tests/regression/test_documented.py recomputes
  them (analytic for every row, simulate for a fixed subset) and fails when the estimator drifts from
  what the docs say, so a changed estimator must come with regenerated docs;
- docs/data/errors-*.md: the error table of each validation file (benchmarks/compare_estimates.py) at the
  current estimator, which docs/accuracy.md summarises (`benchmarks/docs_tables.py`);
- the generated blocks of docs/accuracy.md and README.md (`benchmarks/docs_tables.py`), after the tables;
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
from trainmem.output.report import write_report
from trainmem.result import read_rows
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/
from lab import manifest  # noqa: E402  (which file is which set: lab/sets.json)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_estimates import measured_program  # noqa: E402

VERSIONS = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "docs")
LAB = os.path.join(DOCS, "lab", "data")
"""The dated measurement files (and the held-out tables at the commit each set was reported at)."""
REPORTS = {"report-sweep-t4": ("sweep-chapter-t4-h200-2026-12-02.jsonl", "T4"),
           "report-chapter": ("chapter-measured-and-estimated-2026-12-02.jsonl", "T4")}


SIMULATED = ("qwen2.5-0.5b", "qwen3-0.6b", "gpt2")
"""Models whose rows (up to 1024 tokens) keep their simulate figures for the test: seconds each."""


def documented(file: str) -> list[dict]:
    """The figures docs/ shows for each validation row, for tests/regression/test_documented.py: analytic for every
    row (milliseconds), simulate for SIMULATED's rows."""
    out = []
    for i, r in enumerate(read_rows(os.path.join(LAB, file))):
        setup = measured_program(trainmem.TrainSetup.from_dict(r["setup"]), r.get("env"))
        row = {"file": file, "row": i, "model": r["model"]["name"], "setup": setup.to_dict(), "versions": VERSIONS}
        methods = ["analytic"] + (["simulate"] if r["model"]["name"] in SIMULATED and setup.seq_len <= 1024 else [])
        for method in methods:
            b = estimate(r["model"]["name"], setup, method)
            row[method] = {"peak_allocated": b.memory["peak_allocated"], "peak_reserved": b.memory["peak_reserved"]}
        out.append(row)
    return out


def report(name: str, source: str, gpu: str) -> None:
    """The report page over `source`'s measured rows, each followed by its estimate made now."""
    rows = read_rows(os.path.join(LAB, source))
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
    if "reports" in parts:
        for name, (source, gpu) in REPORTS.items():
            report(name, source, gpu)
    from compare_estimates import compare

    if "tables" in parts:  # every estimate of every row by both methods: a quarter of an hour on 2 cores
        for kind, file in manifest.memory_sets().items():
            compare(os.path.join(LAB, file), os.path.join(DOCS, "data", f"errors-{kind.replace(' ', '-')}.md"))
        import docs_tables  # the figures docs/accuracy.md and the README quote from these tables

        docs_tables.main([])
    if "documented" in parts:
        out = [row for file in manifest.memory_sets().values() for row in documented(file)]
        with open(os.path.join(DOCS, "data", "documented-estimates.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main(sys.argv[1:] or ["documented", "reports", "tables"]))
