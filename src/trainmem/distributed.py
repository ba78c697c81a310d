"""Data-parallel runs as N CPU processes over gloo: DDP or FSDP2, one ledger per rank.

`execute_distributed` spawns `setup.gpus` processes (`torch.multiprocessing`, spawn start method) that
join a gloo process group on 127.0.0.1 at a free port. Each rank builds the same model (same seed),
wraps it (`DistributedDataParallel`, or FSDP2's `fully_shard` on every decoder layer and then the
root), builds the optimizer over the wrapped parameters and trains on its share of the micro-batches
(rank r takes batches r::N), measured by its own TensorLedger exactly as `runner.execute` measures one
process (`trainmem.core.measure`). Each rank writes its Result to a file; the launcher merges them: `ranks` holds every rank's
memory and model states, the top level is the rank with the largest peak.

The processes stand in for GPUs: what each holds is what one GPU would hold (on the CPU, without CUDA
context, NCCL buffers or allocator caching). FSDP2 frees a gathered layer by resizing its storage to
zero (`storage.resize_`), which no operator dispatch shows; `follow_fsdp_storage` routes FSDP2's own
alloc/free helpers so that gathered parameters count only while they are gathered (in `other`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import socket
import tempfile
import traceback
from typing import Any

import torch

from .core import measure
from .data import load_dataset, micro_batches
from .errors import SetupError
from .job import from_job, to_job
from .measure import TensorLedger
from .result import Result
from .setup import TrainSetup
from .specs import ModelSpec

SHARDS_ON_CPU = ("ddp", "fsdp")


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


def merge_ranks(rows: list[dict[str, Any]]) -> Result:
    """The rank with the largest peak becomes the top level; every rank's memory goes to `ranks`."""
    worst = max(rows, key=lambda r: r["memory"]["peak_allocated"])
    top = dict(worst)
    top["ranks"] = [{"rank": r["env"].get("rank", i), "status": r["status"], "peak_phase": r["peak_phase"],
                     "memory": r["memory"], "model_states": r["model_states"]} for i, r in enumerate(rows)]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed and top["status"] == "ok":  # a rank that failed makes the run fail
        for key in ("status", "oom", "error"):
            top[key] = failed[0][key]
    top["env"] = {**top["env"], "rank": None, "peak_rank": worst["env"].get("rank")}
    return Result.from_dict(top)


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


@contextlib.contextmanager
def follow_fsdp_storage(ledger: TensorLedger):
    """Route FSDP2's alloc_storage/free_storage (module-level helpers) through the ledger, so that
    gathered parameters count only while they are gathered (FSDP2 resizes storage, which no dispatch shows)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    init_outputs = _fsdp_param.FSDPParam.init_all_gather_outputs

    def alloc_storage(tensor: torch.Tensor) -> None:
        alloc(tensor)
        ledger.resized(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        free(tensor)
        ledger.resized(tensor)

    def init_all_gather_outputs(self: Any, *args: Any, **kwargs: Any) -> None:
        init_outputs(self, *args, **kwargs)
        for t in self.all_gather_outputs:  # the gathered parameters' home: count it as gathered
            ledger.resized(t)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    _fsdp_param.FSDPParam.init_all_gather_outputs = init_all_gather_outputs
    try:
        yield
    finally:
        _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
        _fsdp_param.free_storage = free
        _fsdp_param.FSDPParam.init_all_gather_outputs = init_outputs


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards as units: the classes the model names in `_no_split_modules`."""
    names: set[str] = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def wrap(model: torch.nn.Module, shard: str, world: int) -> torch.nn.Module:
    """The rank's model as `--shard` spreads it: DDP, or FSDP2 on every decoder layer and then the root."""
    if shard == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


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
