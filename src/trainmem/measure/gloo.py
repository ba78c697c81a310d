"""Data-parallel runs as N CPU processes over gloo: DDP or FSDP2, one ledger per rank.

`execute_distributed` spawns `setup.gpus` processes (`torch.multiprocessing`, spawn start method) that
join a gloo process group on 127.0.0.1 at a free port. Each rank builds the same model (same seed),
wraps it (`trainmem.fsdp.wrap`), builds the optimizer over the wrapped parameters and trains on its share of
the micro-batches (rank r takes batches r::N), measured by its own TensorLedger through the same stages as
one process (`trainmem.measure.stages.measure`). Each rank writes its Result to a file; the launcher merges
them: `ranks` holds every rank's memory and model states, the top level is the rank with the largest peak.

The processes stand in for GPUs: what each holds is what one GPU would hold (on the CPU, without CUDA
context, NCCL buffers or allocator caching); FSDP2's gathered layers count in `other` while they are
gathered (`trainmem.fsdp.follow_fsdp_storage`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import tempfile
import traceback
from typing import Any

import torch

from trainmem.config.job import from_job, to_job
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.fsdp import follow_fsdp_storage, wrap
from trainmem.result import Result, merge_ranks

from .data import load_dataset, micro_batches
from .stages import measure


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def execute_distributed(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> Result:
    """Run `setup.gpus` ranks here (CPU, gloo) and merge their Results; the worst rank is the top level."""
    import torch.multiprocessing as mp

    n = setup.gpus
    batches = math.ceil(setup.dummy_samples() / setup.batch_size) if setup.data is None else None
    if batches is not None and batches < n:
        raise SetupError([f"--gpus {n}: {setup.dummy_samples()} samples make {batches} micro-batches, "
                          f"fewer than one per rank; use --num-samples {n * setup.batch_size} or more"])
    job = to_job(spec, setup, device=device, precision=precision)
    with tempfile.TemporaryDirectory(prefix="trainmem-ranks-") as tmp:
        try:
            mp.start_processes(_rank_main, args=(n, _free_port(), job, tmp), nprocs=n, join=True,
                               start_method="spawn")
        except Exception:
            failure = traceback.format_exc()
        else:
            failure = None
        rows = []
        for r in range(n):
            path = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    rows.append(json.load(f))
    if len(rows) < n:
        return Result(kind="measurement", status="error", setup=setup.replace(device=device, precision=precision)
                      .to_dict(), model=spec.describe(), effective_batch=setup.effective_batch,
                      error=f"{n - len(rows)} of {n} ranks returned no result:\n{failure or ''}")
    return merge_ranks(rows)


def _rank_main(rank: int, world: int, port: int, job: dict[str, Any], tmp: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    # The ranks share this machine's cores: split them, as N GPUs would not compete.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        spec, setup = from_job(job)
        row = measure_rank(spec, setup, job["precision"], rank, world).to_dict()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(tmp, f"rank{rank}.json.tmp"), "w") as f:
        json.dump(row, f)
    os.replace(os.path.join(tmp, f"rank{rank}.json.tmp"), os.path.join(tmp, f"rank{rank}.json"))


def measure_rank(spec: ModelSpec, setup: TrainSetup, precision: str, rank: int, world: int) -> Result:
    """One rank of the run: `core.measure` on this rank's micro-batches, around a wrapped model."""
    samples, pad_id = load_dataset(spec, setup)
    batches = micro_batches(samples, setup.batch_size, pad_id)[rank::world]
    follow = follow_fsdp_storage if setup.shard == "fsdp" else None
    result = measure(spec, setup, "cpu", precision, batches,
                     wrap=lambda model: wrap(model, setup.shard, world), follow=follow,
                     env={"backend": "gloo", "rank": rank, "world_size": world})
    result.notes.append(f"{world} CPU processes over gloo stand in for {world} GPUs ({setup.shard}); "
                        "each rank's memory is its own ledger's (no CUDA context or NCCL buffers)")
    if setup.shard == "fsdp":
        result.notes.append("FSDP2: gathered (unsharded) layers count in `other` while they are gathered")
    return result
