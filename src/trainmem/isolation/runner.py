"""One experiment, isolated: a fresh Python process per experiment; a crash or a hang becomes a result.

`run()` starts `python -m trainmem.isolation.worker` for each experiment by default, so no memory from an earlier
experiment leaks into the next one (the seed's QLoRA run started with 0.945 GB left over from a previous
cell) and a crash cannot take the caller down. The worker runs `engines.execute_validated`; with
`isolate=False`, `engines.execute` runs here instead (`trainmem.isolation.runner.execute` is that function). This
module imports no torch: the parent of an isolated run stays light and holds no CUDA context of its own
next to the one it measures. Interrupted (Ctrl-C; SIGTERM too under the command line, which turns it into
`trainmem.errors.Interrupted`), `run` stops the worker's process group and removes the experiment's temp
folder before the interruption goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

from trainmem.config.job import to_job
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.result import Result

from .engines import execute


def run(spec: ModelSpec | str, setup: TrainSetup | None = None, isolate: bool = True,
        timeout: float | None = None) -> Result:
    """Measure one setup: build, train `setup.steps` steps, read every phase.

    Args:
        spec: a ModelSpec or a name `ModelSpec.resolve` takes (preset, config.json, folder, hub id).
        setup: validated here against the model, once (default: `TrainSetup()`).
        isolate: run in a fresh process (default); False runs in this one (faster, may keep memory).
        timeout: seconds after which the isolated process is stopped and the row says so.
    Returns:
        The row, status `ok`, `oom` or `error`. Raises SetupError, listing every problem, for bad input.
    """
    spec = ModelSpec.resolve(spec) if isinstance(spec, str) else spec
    setup = (setup or TrainSetup()).validate(spec)
    if not isolate:
        return execute(spec, setup)
    with tempfile.TemporaryDirectory(prefix="trainmem-") as tmp:  # removed on the way out, interrupted or not
        job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        with open(job, "w") as f:
            json.dump(to_job(spec, setup), f)
        proc = None
        try:  # its own session: a Ctrl-C reaches this process alone, which stops the worker's whole group
            proc = subprocess.Popen([sys.executable, "-m", "trainmem.isolation.worker", job, out],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            return _failed(spec, setup, f"the experiment ran past {timeout} s and was stopped")
        except BaseException:  # SIGINT/SIGTERM (trainmem.errors.Interrupted), or any error here
            if proc is not None:
                stop(proc)
            raise
        if not os.path.exists(out):
            return _failed(spec, setup, f"the worker process died (exit {proc.returncode}):\n"
                                        + "\n".join(err.splitlines()[-20:]))
        with open(out) as f:
            row = json.load(f)
    if row.get("status") == "invalid":
        raise SetupError(row["problems"])
    return Result.from_dict(row)


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop a worker and what it started (its process group): SIGTERM, then SIGKILL after `grace` seconds;
    returns once it is gone, its pipe closed."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    if proc.stderr:
        proc.stderr.close()


def _failed(spec: ModelSpec, setup: TrainSetup, why: str) -> Result:
    """The row of a worker that returned none (it died or ran out of time): the setup as given."""
    return Result(kind="measurement", status="error", setup=setup.to_dict(), model={"name": spec.name},
                  effective_batch=setup.effective_batch, error=why)


__all__ = ["run", "stop"]
