"""Entry point of the isolated experiment process: `python -m trainmem.isolation.worker JOB.json RESULT.json`.

The job comes from `runner.run`, which validated the setup against the model; the worker checks only
what depends on the process it runs in (`engines.execute_validated`) and writes one row, whole or none.
"""

from __future__ import annotations

import json
import os
import sys

from trainmem.config.job import from_job
from trainmem.errors import SetupError

from .engines import execute_validated


def main(job_path: str, out_path: str) -> int:
    """Run the job and write its row (or the setup's problems, status `invalid`) to `out_path`."""
    with open(job_path) as f:
        spec, setup = from_job(json.load(f))
    try:
        row = execute_validated(spec, setup).to_dict()
    except SetupError as e:
        row = {"status": "invalid", "problems": e.problems}
    with open(out_path + ".tmp", "w") as f:
        json.dump(row, f)
    os.replace(out_path + ".tmp", out_path)  # the parent sees a whole result or none
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
