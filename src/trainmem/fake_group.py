"""One rank of an N-rank FSDP2 run in this one process, through PyTorch's fake process group.

`init_process_group("fake", rank=r, world_size=N, store=FakeStore())` makes a group whose collectives
return at once and copy local data (all-gather fills every chunk with the local input, reduce-scatter
keeps this rank's chunk). FSDP2 still shards every parameter to 1/N, allocates its all-gather and
reduce-scatter buffers and frees gathered layers, so the memory one rank holds is real, on the CPU
(tensors, counted by the TensorLedger) or on one GPU. Not measured: NCCL's own buffers, and the overlap
of communication with compute (the fake collectives finish before the next kernel, so buffers that a
real run keeps alive while a collective is in flight may live shorter here).

The precision flags map to FSDP2's `MixedPrecisionPolicy` as torchtitan does:
- `amp-bf16` (`amp-fp16`): fp32 sharded master weights (what AdamW updates), bf16 (fp16) parameters
  gathered for compute, gradients reduced in fp32 (`param_dtype=bf16, reduce_dtype=fp32`); trainmem's
  loop keeps its autocast region around the forward, which is then a no-op on the gathered weights;
- `bf16` (`fp16`): the weights are built in bf16 (fp16) and everything stays there (no policy needed);
- `fp32`: fp32 everywhere (the default policy).
LoRA: the base model's frozen weights are sharded with the adapters in the same decoder-layer units;
only the adapters have gradients and optimizer states.

`measure_rank_here` is the per-rank experiment; `measure_emulated` runs one rank (or every rank in turn)
under the fake group. With N real GPUs the same per-rank function would run once per GPU under torchrun
with NCCL: `torchrun_main` is that entry point, written but never run here (no machine with several GPUs).
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any, Iterator

import torch

from .result import Result
from .setup import TrainSetup
from .specs import ModelSpec

HALF = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}


def precision_policy(precision: str) -> Any:
    """FSDP2's MixedPrecisionPolicy for a trainmem precision flag (see the module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision in HALF:
        return MixedPrecisionPolicy(param_dtype=HALF[precision], reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # fp32, bf16, fp16: the weights' own dtype throughout


@contextlib.contextmanager
def fake_group(rank: int, world: int) -> Iterator[None]:
    """A fake process group for the duration of the block, destroyed afterwards even on errors."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process: the fake group for an "
                           "emulated rank needs a process of its own (trainmem run isolates each experiment)")
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard_model(model: torch.nn.Module, world: int, precision: str, device_type: str) -> torch.nn.Module:
    """`fully_shard` every decoder layer, then the root, over a 1-D mesh of `world` ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from .distributed import decoder_layers

    mesh = init_device_mesh(device_type, (world,))
    policy = precision_policy(precision)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def ranks_of(setup: TrainSetup) -> list[int]:
    """The ranks `--rank` names: one, or every rank in turn for `all`; 0 when it is not given."""
    if setup.rank == "all":
        return list(range(setup.gpus))
    return [int(setup.rank or 0)]


def measure_rank_here(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, rank: int, world: int,
                      env: dict[str, Any]) -> Result:
    """One rank of the FSDP2 run, in a process whose default process group is already initialised."""
    from .core import measure
    from .data import load_dataset, micro_batches
    from .distributed import follow_fsdp_storage

    samples, pad_id = load_dataset(spec, setup)
    batches = micro_batches(samples, setup.batch_size, pad_id)
    k = rank % len(batches)  # this rank's share first; every micro-batch has the same shape
    batches = batches[k:] + batches[:k]
    device_type = "cuda" if device == "cuda" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(0)
    seen: dict[str, Any] = {}

    def follow(ledger: Any) -> Any:
        seen["ledger"] = ledger
        return follow_fsdp_storage(ledger)

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        # trainmem builds the whole model on the device, then shards it; a production FSDP2 run builds
        # on meta and materialises only its shard, so the peak starts once the model is sharded
        shard_model(model, world, precision, device_type)
        gc.collect()
        seen["ledger"].restart_peak()
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        return model

    result = measure(spec, setup, device, precision, batches, wrap=wrap, follow=follow,
                     env={**env, "rank": rank, "world_size": world})
    result.notes.append("the unsharded model built before fully_shard is not counted: the peak starts once "
                        "the model is sharded (the `load` phase shows the sharded model)")
    return result


def measure_emulated(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> Result:
    """Rank `--rank` (or each in turn) of the `--gpus` N-rank FSDP2 run, each under its own fake group."""
    from .distributed import merge_ranks

    n = setup.gpus
    rows = []
    for rank in ranks_of(setup):
        with fake_group(rank, n):
            r = measure_rank_here(spec, setup, device, precision, rank, n,
                                  {"backend": "fake", "emulated_world": n})
        r.notes.append(f"emulated: rank {rank} of {n} through PyTorch's fake process group on one "
                       f"{'GPU' if device == 'cuda' else 'CPU process'} (FSDP2, {precision}: "
                       f"{_policy_words(precision)}); not measured: NCCL's buffers, overlap of communication "
                       "with compute")
        r.notes.append("FSDP2: gathered (unsharded) layers count in `other` while they are gathered")
        rows.append(r.to_dict())
    if len(rows) == 1:
        return Result.from_dict(rows[0])
    merged = merge_ranks(rows)
    merged.env["emulated_world"] = n
    return merged


def _policy_words(precision: str) -> str:
    if precision in HALF:
        half = "bf16" if HALF[precision] == torch.bfloat16 else "fp16"
        return f"fp32 sharded master weights, {half} compute parameters, fp32 gradient reduction"
    return f"{precision} weights, compute and reduction"


def torchrun_main() -> None:  # pragma: no cover - needs N GPUs and torchrun; never run in this repository
    """With N real GPUs: `torchrun --nproc-per-node N -m trainmem.fake_group JOB.json OUT_DIR`, one process
    per GPU over NCCL, each writing its rank's Result to OUT_DIR/rank{R}.json for `merge_ranks`. UNRUN."""
    import json
    import sys

    import torch.distributed as dist

    from .job import from_job

    job, out = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    with open(job) as f:
        spec, setup = from_job(json.load(f))
    dist.init_process_group("nccl")
    try:
        row = measure_rank_here(spec, setup, "cuda", setup.resolved_precision(spec, "cuda"), rank, world,
                                {"backend": "nccl"}).to_dict()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(row, f)


if __name__ == "__main__":  # pragma: no cover
    torchrun_main()


__all__ = ["precision_policy", "fake_group", "shard_model", "measure_emulated", "measure_rank_here",
           "torchrun_main"]
