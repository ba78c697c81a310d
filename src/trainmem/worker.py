"""Entry point of the isolated experiment process: `python -m trainmem.worker JOB.json RESULT.json`."""

from __future__ import annotations

import json
import os
import sys

from .errors import SetupError
from .runner import execute
from .setup import TrainSetup
from .specs import ModelSpec


def main(job_path: str, out_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    spec = ModelSpec(**job["spec"])
    setup = TrainSetup.from_dict(job["setup"])
    try:
        row = execute(spec, setup).to_dict()
    except SetupError as e:
        row = {"status": "invalid", "problems": e.problems}
    with open(out_path + ".tmp", "w") as f:
        json.dump(row, f)
    os.replace(out_path + ".tmp", out_path)  # the parent sees a whole result or none
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
