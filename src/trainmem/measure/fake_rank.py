"""One rank of an N-rank FSDP2 run in this one process, through PyTorch's fake process group
(`trainmem.fsdp.fake_group`): the memory one rank holds is real, on the CPU (tensors, counted by the
TensorLedger) or on one GPU. Not measured: NCCL's own buffers, and the overlap of communication with compute
(the fake collectives finish before the next kernel, so buffers that a real run keeps alive while a collective
is in flight may live shorter here). The precision flags map to FSDP2's `MixedPrecisionPolicy` as
`trainmem.fsdp.precision_policy` says; trainmem's loop keeps its autocast region around the forward, which is
then a no-op on the gathered half-precision weights.

A rank starts as torchtitan starts one: the model (and its LoRA adapters) is built on the meta device, wrapped by
`fully_shard` there (`trainmem.fsdp.shard_model`), and only this rank's shards are materialised on the device and
initialised (`measure.build.materialise`); the peak counts from the start of the load, so a rank of a model larger
than the device (a Llama-3.1-70B rank of 16 or more) is measured on one GPU. QLoRA's rank is the exception:
bitsandbytes quantizes while it loads, so the whole model is loaded first, then sharded, and its peak restarts once
it is sharded.

`measure_rank_here` is the per-rank experiment (FSDP2 or DDP), in whatever default process group the process
holds: `measure_emulated` runs one rank (or every rank in turn) under the fake group, and
`trainmem.measure.torchrun` runs each rank of a real group under torchrun.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.fsdp import fake_group, follow_fsdp_storage, policy_words, shard_model
from trainmem.fsdp import wrap as fsdp_wrap
from trainmem.result import Result, merge_ranks


def ranks_of(setup: TrainSetup) -> list[int]:
    """The ranks `--rank` names: one, or every rank in turn for `all`; 0 when it is not given."""
    if setup.rank == "all":
        return list(range(setup.gpus))
    return [int(setup.rank or 0)]


def measure_rank_here(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, rank: int, world: int,
                      env: dict[str, Any], on_meta: bool | None = None, cuda_index: int = 0) -> Result:
    """One rank of the `setup.shard` (fsdp or ddp) run, in a process whose default process group is already
    initialised: the fake group here, a real one (NCCL, gloo) under torchrun (`trainmem.measure.torchrun`).
    `on_meta` (FSDP2): built on meta and only this rank's shards materialised (the default, but for QLoRA), or
    False: the whole model built on the device first, as QLoRA's rank is (tests compare the two). `cuda_index`:
    the GPU this rank runs on (its LOCAL_RANK under torchrun, 0 for an emulated rank)."""
    from .data import load_dataset, micro_batches
    from .stages import measure

    samples, pad_id = load_dataset(spec, setup)
    batches = micro_batches(samples, setup.batch_size, pad_id)
    k = rank % len(batches)  # this rank's share first; every micro-batch has the same shape
    batches = batches[k:] + batches[:k]
    device_type = "cuda" if device == "cuda" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(cuda_index)  # before the device mesh, which would otherwise pick one itself
    if setup.shard == "ddp":  # every rank holds the whole model, on its own device
        return measure(spec, setup, device, precision, batches, wrap=lambda model: fsdp_wrap(model, "ddp", world),
                       env={**env, "rank": rank, "world_size": world})
    if on_meta if on_meta is not None else setup.peft != "qlora":
        # as torchtitan starts a rank: built and sharded on the meta device, then only this rank's shards
        # materialised and initialised, all counted from the start of the load phase
        result = measure(spec, setup, device, precision, batches, on_meta=True, follow=follow_fsdp_storage,
                         wrap=lambda model: shard_model(model, world, precision, device_type),
                         env={**env, "rank": rank, "world_size": world})
        result.notes.append("built on the meta device and sharded there; only this rank's shards were materialised "
                            "(random values), so the peak counts the load of a production FSDP2 rank")
        if spec.has_weights:
            result.notes.append("the checkpoint's weights were not read: the rank's shards hold random values of "
                                "the same shapes and dtypes")
        return result
    return _measure_whole_then_shard(spec, setup, device, precision, batches, rank, world, env)


def _measure_whole_then_shard(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, batches: list,
                              rank: int, world: int, env: dict[str, Any]) -> Result:
    """QLoRA's rank: bitsandbytes quantizes while it loads, which no meta build reproduces, so the whole model is
    loaded on the device, then sharded; the peak starts once it is sharded."""
    from .stages import measure

    device_type = "cuda" if device == "cuda" else "cpu"
    seen: dict[str, Any] = {}

    def follow(ledger: Any) -> Any:
        seen["ledger"] = ledger
        return follow_fsdp_storage(ledger)

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
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
    n = setup.gpus
    rows = []
    for rank in ranks_of(setup):
        with fake_group(rank, n):
            r = measure_rank_here(spec, setup, device, precision, rank, n,
                                  {"backend": "fake", "emulated_world": n})
        r.notes.append(f"emulated: rank {rank} of {n} through PyTorch's fake process group on one "
                       f"{'GPU' if device == 'cuda' else 'CPU process'} (FSDP2, {precision}: "
                       f"{policy_words(precision)}); not measured: NCCL's buffers, overlap of communication "
                       "with compute")
        r.notes.append("FSDP2: gathered (unsharded) layers count in `other` while they are gathered")
        rows.append(r.to_dict())
    return ranks_result(rows, n)


def ranks_result(rows: list[dict], n: int) -> Result:
    """The result of emulated ranks of an n-rank run: the one rank's row, or every rank's merged (`merge_ranks`)."""
    if len(rows) == 1:
        return Result.from_dict(rows[0])
    merged = merge_ranks(rows)
    merged.env["emulated_world"] = n
    return merged


__all__ = ["measure_emulated", "measure_rank_here", "ranks_of", "ranks_result"]
