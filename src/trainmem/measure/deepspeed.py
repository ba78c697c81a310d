"""One rank of an N-rank DeepSpeed ZeRO run (`run --engine deepspeed --shard zero1|zero2|zero3`) in this one
process, through PyTorch's fake process group (`trainmem.fsdp.fake_group`), as `fake_rank` measures an FSDP2 rank.

DeepSpeed's engine runs as a user runs it: `deepspeed.initialize(model=..., optimizer=..., config=...)` with
trainmem's own optimizer (`--optimizer`, which DeepSpeed's ZeRO optimizer wraps: it keeps the fp32 master
partitions and steps the wrapped optimizer on them), `bf16.enabled` for `--precision bf16` (bf16 weights, fp32
master weights and moments) and fp32 weights for `fp32` and `amp-bf16` (`torch_autocast` enabled in the config,
so that the engine's forward runs under bf16 autocast); `--offload optimizer|params` is ZeRO-Offload's `offload_optimizer` / `offload_param` to the CPU.
Under ZeRO-3 the model is built as transformers builds it for DeepSpeed: inside `deepspeed.zero.Init` (an
`HfDeepSpeedConfig` is alive while it loads), so that each module's parameters are partitioned as it is made.
trainmem's loop calls `loss.backward()` on the engine's output, which DeepSpeed supports (its output hooks run
the backward epilogue: the gradient reduction), and `engine.step()` as the optimizer's step.

The fake group's collectives copy local data and return at once, so DeepSpeed allocates its gather and reduce
buffers and partitions as on a real rank; two things are set aside for it, neither of which holds memory: the
ZeRO-3 check that every rank traced the same module order (a broadcast from rank 0 that the fake group does not
fill), and DeepSpeed's shared-memory all-reduce for CPU ranks (a C++ extension it would compile, with no peers
here). Not measured: NCCL's buffers and the overlap of communication with compute, as for an FSDP2 rank.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.fsdp import fake_group
from trainmem.result import Result

PRECISIONS = ("bf16", "amp-bf16", "fp32")
"""What the engine runs: DeepSpeed's fp16 needs its loss scaler, which trainmem's loop does not drive."""


def ds_config(setup: TrainSetup, precision: str, hidden: int) -> dict[str, Any]:
    """The DeepSpeed config of a setup: its ZeRO stage, offload and precision; one micro-batch per engine step
    (trainmem's loop accumulates the window itself and steps once per window). The buckets are those
    transformers' Trainer fills in for a config that says `auto` (`HfTrainerDeepSpeedConfig.trainer_config_finalize`,
    from the model's hidden size h: reduce bucket h*h, ZeRO-3 prefetch bucket 0.9*h*h, parameters of fewer than 10*h
    elements kept whole); DeepSpeed's own defaults (5e8-element buckets, a 1 GB bf16 reduce buffer under ZeRO-3)
    are larger than a small model."""
    zero: dict[str, Any] = {"stage": int(setup.shard[-1]), "reduce_bucket_size": hidden * hidden}
    if setup.shard == "zero3":
        zero.update(stage3_prefetch_bucket_size=int(0.9 * hidden * hidden), stage3_param_persistence_threshold=10 * hidden)
    if setup.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu"}
    if setup.offload == "params":
        zero["offload_param"] = {"device": "cpu"}
    config: dict[str, Any] = {}
    if precision == "amp-bf16":
        # DeepSpeed's engine turns an autocast it finds around its forward off unless its own config enables one
        # (`deepspeed.runtime.torch_autocast.autocast_if_enabled`): the loop's autocast alone would run fp32
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    return {**config, "train_micro_batch_size_per_gpu": setup.batch_size, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": precision == "bf16"}, "zero_optimization": zero,
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 2**31 - 1}


class EngineStep:
    """What trainmem's loop calls its optimizer: `step` is the engine's step (the ZeRO optimizer's step, its
    gradient clearing and the engine's counters); `state` is what the rank keeps for the optimizer on the run's
    device (the fp32 master partitions and the wrapped optimizer's states), for the row's split of the peak."""

    def __init__(self, engine: Any, device: torch.device):
        self.engine = engine
        self.device = device

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The engine's step has cleared the gradients already."""

    @property
    def state(self) -> dict[Any, dict[str, torch.Tensor]]:
        zero = self.engine.optimizer
        flat = getattr(zero, "fp32_partitioned_groups_flat", None) or getattr(zero, "single_partition_of_fp32_groups")
        masters = {str(i): p for i, p in enumerate(flat)}
        inner = zero.optimizer
        found = {**inner.state, "fp32 masters": masters}
        return {k: {n: t for n, t in s.items() if isinstance(t, torch.Tensor) and t.device.type == self.device.type}
                for k, s in found.items()}


def _finite_partitions(model: torch.nn.Module) -> None:
    """ZeRO-3 initialises each weight gathered and hands rank 0's values out by a broadcast, which the fake group
    does not fill: another rank's partitions hold whatever the memory held, and a non-finite gradient makes
    DeepSpeed skip the step (and so never make the optimizer's states). Its partitions are drawn again, in place;
    memory does not depend on the values."""
    with torch.no_grad():
        for p in model.parameters():
            part = getattr(p, "ds_tensor", None)
            if part is not None and part.is_floating_point():
                part.normal_(0.0, 0.02)


@contextlib.contextmanager
def _rank_environment(rank: int, world: int) -> Iterator[None]:
    """What a launcher sets for a DeepSpeed rank (its device is the first one here); DeepSpeed's rank-agreement
    check and CPU shared-memory all-reduce set aside (see the module docstring); and DeepSpeed's module-level
    process groups and communication backend put back afterwards, so that the next rank (`--rank all`) starts
    from a fresh fake group as the first did."""
    import importlib

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` as an attribute is torch
    coordinator = importlib.import_module("deepspeed.runtime.zero.partitioned_param_coordinator")
    kept = [(m, dict(vars(m))) for m in (importlib.import_module("deepspeed.comm.comm"),
                                          importlib.import_module("deepspeed.utils.groups"))]
    names = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "1"}
    before = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        with mock.patch.object(coordinator, "assert_ints_same_as_other_ranks", lambda ints: None), \
                mock.patch.object(ds_torch, "build_shm_op", lambda: None):
            yield
    finally:
        for module, values in kept:
            vars(module).update({k: copy.copy(v) for k, v in values.items()
                                 if k[:1] == "_" and k[1:2].isupper() or k in ("cdb", "mpu", "mesh_device")})
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _torch_put_back() -> Iterator[None]:
    """torch's functions as they were before the rank: a ZeRO-3 engine leaves `torch.nn.functional.linear` as its
    own autograd function (`zero3_linear_wrap`, which saves other tensors for backward) and `torch.manual_seed`
    wrapped, for the rest of the process; an estimate or a plan later in the same process would count its kernels
    and tensors through them."""
    import torch.nn.functional as F

    linear, seed = F.linear, torch.manual_seed
    try:
        yield
    finally:
        F.linear, torch.manual_seed = linear, seed


def measure_zero_rank(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, rank: int,
                      world: int) -> Result:
    """Rank `rank` of the `world`-rank ZeRO run, in a process whose fake group is already initialised."""
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    from .build import build_optimizer
    from .data import load_dataset, micro_batches
    from .stages import measure

    samples, pad_id = load_dataset(spec, setup)
    batches = micro_batches(samples, setup.batch_size, pad_id)
    k = rank % len(batches)
    batches = batches[k:] + batches[:k]
    if device == "cuda":
        torch.cuda.set_device(0)
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    config = ds_config(setup, precision, spec.hf_config().hidden_size)
    made: dict[str, Any] = {}

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        _finite_partitions(model)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=build_optimizer(model, setup), config=config)
        made["step"] = EngineStep(engine, dev)
        return engine

    spec.describe()  # the spec's own meta model, built before transformers would build it inside zero.Init
    # alive while the model loads: transformers builds it inside deepspeed.zero.Init under ZeRO-3
    zero3 = HfDeepSpeedConfig(config)  # noqa: F841
    result = measure(spec, setup, device, precision, batches, wrap=wrap, make_optimizer=lambda model: made["step"],
                     env={"backend": "fake", "emulated_world": world, "rank": rank, "world_size": world,
                          "deepspeed": deepspeed.__version__})
    del zero3
    return result


def measure_deepspeed(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> Result:
    """Rank `--rank` (or each in turn) of the `--gpus` N-rank ZeRO run, each under its own fake group."""
    from .fake_rank import ranks_of, ranks_result

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device == "cuda" else "cpu")  # read at DeepSpeed's import
    import deepspeed.utils

    deepspeed.utils.logger.setLevel("WARNING")
    n = setup.gpus
    rows = []
    for rank in ranks_of(setup):
        with fake_group(rank, n), _rank_environment(rank, n), _torch_put_back():
            r = measure_zero_rank(spec, setup, device, precision, rank, n)
        r.notes.append(f"emulated: rank {rank} of {n} of DeepSpeed {setup.shard.upper()} through PyTorch's fake "
                       f"process group on one {'GPU' if device == 'cuda' else 'CPU process'}; not measured: "
                       "NCCL's buffers, overlap of communication with compute")
        r.notes.append("DeepSpeed's flat buffers (gradient partitions and buckets"
                       + (", gathered parameters" if setup.shard == "zero3" else "") + ") count in `other`")
        rows.append(r.to_dict())
    return ranks_result(rows, n)


__all__ = ["EngineStep", "PRECISIONS", "ds_config", "measure_deepspeed", "measure_zero_rank"]
