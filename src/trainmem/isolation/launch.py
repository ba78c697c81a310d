"""`trainmem run --launch`: every rank of a run of several GPUs (or CPU processes) as its own process under
torchrun on this machine, then one merged row.

`command` writes the job (`trainmem.config.job.to_job`, with the resolved device and precision) and spells
`torchrun --standalone --nproc-per-node N -m trainmem.measure.torchrun JOB.json OUT_DIR`: torchrun beside this
Python (a virtual environment's), else this Python's `-m torch.distributed.run`, which is the same program.
`launch` runs it and merges the ranks' rows (`trainmem.result.merge_ranks`, as the gloo and fake-group ranks are
merged): the rank with the largest peak is the top level. NCCL on CUDA, gloo on the CPU; the rank's code is
`trainmem.measure.torchrun`. Like `runner`, this module imports no torch: the launcher holds no CUDA context
on any GPU a rank measures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from trainmem.config.job import to_job
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.result import Result, merge_ranks

from .runner import stop

SHARDS = ("fsdp", "ddp")


def launch_problems(setup: TrainSetup) -> list[str]:
    """What `--launch` cannot run, each naming the flag and the fix (the setup's own problems are its own)."""
    out = []
    if not isinstance(setup.gpus, int) or setup.gpus < 2 or setup.shard not in SHARDS:
        out.append(f"--launch: runs N ranks as N processes; needs --gpus N (N >= 2) and --shard fsdp|ddp "
                   f"(got --gpus {setup.gpus} --shard {setup.shard})")
    if setup.rank is not None:
        out.append(f"--rank {setup.rank}: --launch runs every rank; drop --rank, or drop --launch to emulate one")
    return out


def torchrun() -> list[str]:
    """The torchrun of this Python: its console script beside the interpreter, else `python -m
    torch.distributed.run`; a SetupError when torch (which ships torchrun) is not installed."""
    script = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if os.access(script, os.X_OK):
        return [script]
    if importlib.util.find_spec("torch") is None:
        raise SetupError([f"--launch: torchrun is not installed for {sys.executable} (it ships with torch); "
                          "pip install torch, or drop --launch"])
    return [sys.executable, "-m", "torch.distributed.run"]


def command(spec: ModelSpec, setup: TrainSetup, folder: str) -> list[str]:
    """Write the job into `folder` and return the torchrun command that runs its ranks, each writing
    `folder`/ranks/rank-R.json."""
    problems = launch_problems(setup)
    if problems:
        raise SetupError(problems)
    device = setup.resolved_device()
    job = to_job(spec, setup.resolved(spec), device=device, precision=setup.resolved_precision(spec, device))
    path, out = os.path.join(folder, "job.json"), os.path.join(folder, "ranks")
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(job, f)
    return [*torchrun(), "--standalone", "--nproc-per-node", str(setup.gpus), "-m", "trainmem.measure.torchrun",
            path, out]


def prepare(spec: ModelSpec, setup: TrainSetup) -> list[str]:
    """`--print-only`: the command, its job written to a folder that is kept for it (removed on a problem)."""
    folder = tempfile.mkdtemp(prefix="trainmem-launch-")
    try:
        return command(spec, setup.validate(spec), folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def launch(spec: ModelSpec, setup: TrainSetup, timeout: float | None = None) -> Result:
    """Run every rank under torchrun here and merge their rows. Raises SetupError for bad input (the
    launcher's, or a rank's: this machine's GPUs, its CUDA); a rank that died is an `error` row."""
    setup = setup.validate(spec)
    with tempfile.TemporaryDirectory(prefix="trainmem-launch-") as tmp:
        cmd = command(spec, setup, tmp)
        proc = None
        try:  # its own session: a Ctrl-C stops torchrun and every rank it started
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            err = f"the ranks ran past {timeout} s and were stopped"
        except BaseException:
            if proc is not None:
                stop(proc)
            raise
        rows = []
        for r in range(setup.gpus):
            path = os.path.join(tmp, "ranks", f"rank-{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    rows.append(json.load(f))
    invalid = [row for row in rows if row.get("status") == "invalid"]
    if invalid:
        raise SetupError(list(dict.fromkeys(p for row in invalid for p in row["problems"])))
    if len(rows) < setup.gpus:
        tail = "\n".join((err or "").splitlines()[-20:])
        return Result(kind="measurement", status="error", setup=setup.to_dict(), model=spec.describe(),
                      effective_batch=setup.effective_batch,
                      error=f"{setup.gpus - len(rows)} of {setup.gpus} ranks returned no result (torchrun exit "
                            f"{proc.returncode if proc else None}):\n{tail}")
    return merge_ranks(rows)


__all__ = ["command", "launch", "launch_problems", "prepare", "torchrun"]
