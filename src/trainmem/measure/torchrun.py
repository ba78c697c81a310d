"""One rank of a real run of several processes, started by torchrun:
`torchrun --standalone --nproc-per-node N -m trainmem.measure.torchrun JOB.json OUT_DIR`.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; the rank joins the default process
group from them (NCCL on CUDA, gloo on the CPU), runs on GPU LOCAL_RANK, measures itself with the per-rank
experiment the fake group also runs (`trainmem.measure.fake_rank.measure_rank_here`) and writes its row to
OUT_DIR/rank-R.json (a problem of this machine: `{"status": "invalid", "problems": [...]}`, as the isolated
worker writes). The job is `trainmem.config.job.to_job`'s, with the resolved device and precision.
`trainmem.isolation.launch` starts it and merges the rows.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import torch

from trainmem.config.job import from_job
from trainmem.errors import SetupError
from trainmem.fsdp import policy_words

from .build import environment_problems
from .fake_rank import measure_rank_here


def _write(out_dir: str, rank: int, row: dict[str, Any]) -> None:
    path = os.path.join(out_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(row, f)
    os.replace(path + ".tmp", path)  # the launcher reads a whole row or none


def gpu_problems(device: str, local_world: int) -> list[str]:
    """A rank count this machine cannot give each rank a GPU of its own for."""
    if device != "cuda":
        return []
    seen = torch.cuda.device_count()
    if seen < local_world:
        fix = f"use --gpus {seen} or fewer" if seen >= 2 else "drop --launch to emulate one rank on one GPU"
        return [f"--gpus {local_world}: this machine shows {seen} GPU{'s' * (seen != 1)} and each rank needs its "
                f"own; {fix}, or use --device cpu for {local_world} processes over gloo"]
    return []


def main(job_path: str, out_dir: str) -> int:
    """Measure this process's rank of the job and write its row; returns 0 whenever a row was written."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    with open(job_path) as f:
        job = json.load(f)
    spec, setup = from_job(job)
    device, precision = job["device"], job["precision"]
    problems = gpu_problems(device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    problems = problems or environment_problems(setup, device, precision, launched=True)
    if problems:
        _write(out_dir, rank, {"status": "invalid", "problems": problems})
        return 0
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(local)
    else:  # the ranks share this machine's cores: split them, as N GPUs would not compete
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600))
    try:
        result = measure_rank_here(spec, setup, device, precision, rank, world,
                                   {"backend": backend, "launcher": "torchrun", "local_rank": local},
                                   cuda_index=local)
    except SetupError as e:  # found while building: the input's problem, one line each
        _write(out_dir, rank, {"status": "invalid", "problems": e.problems})
        return 0
    finally:
        dist.destroy_process_group()
    where = f"{world} GPUs over NCCL" if device == "cuda" else f"{world} CPU processes over gloo"
    result.notes.append(f"rank {rank} of {world} processes under torchrun, {where} ({setup.shard}"
                        + (f", {precision}: {policy_words(precision)})" if setup.shard == "fsdp" else ")"))
    if setup.shard == "fsdp":
        result.notes.append("FSDP2: gathered (unsharded) layers count in `other` while they are gathered")
    _write(out_dir, rank, result.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
