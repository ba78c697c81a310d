"""Makes chapter-sample.jsonl: the chapter's 14 measured H200 rows (docs/lab/data) and trainmem's estimate of
each same setup, so the report tests run on real measurements next to real estimates.

    python tests/data/make_sample.py
"""

import json
from pathlib import Path

import trainmem

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "docs" / "lab" / "data" / "chapter-h200-2026-12-02.jsonl"

rows = [json.loads(line) for line in SOURCE.read_text().splitlines() if line.strip()]
with open(HERE / "chapter-sample.jsonl", "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
    for row in rows:
        setup = trainmem.TrainSetup.from_dict({**row["setup"], "device": "auto"})
        est = trainmem.estimate(row["model"]["name"], setup).to_result(setup.gpu)
        f.write(json.dumps(est.to_dict()) + "\n")
