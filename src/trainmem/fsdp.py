"""FSDP2 mechanics, shared by the measured ranks (`measure.gloo`, `measure.fake_rank`) and the simulated one
(`estimator.memory.sharded`): one place that says how a rank's model is wrapped and what it holds.

- `fake_group`: PyTorch's fake process group. Its collectives return at once and copy local data (all-gather
  fills every chunk with the local input, reduce-scatter keeps this rank's chunk), so FSDP2 still shards every
  parameter to 1/N, allocates its all-gather and reduce-scatter buffers and frees gathered layers: what one
  rank holds is real. Not seen: NCCL's own buffers, and the overlap of communication with compute.
- `shard_model` / `wrap`: `fully_shard` on every decoder layer (`decoder_layers`, the classes the model names
  in `_no_split_modules`), then on the root; or DDP.
- `precision_policy`: the precision flags as FSDP2's `MixedPrecisionPolicy`, as torchtitan maps them:
  `amp-bf16` (`amp-fp16`) keeps fp32 sharded master weights, gathers bf16 (fp16) parameters for compute and
  reduces gradients in fp32; `bf16`/`fp16`/`fp32` keep the weights' own dtype throughout.
- `follow_fsdp_storage`: FSDP2 frees a gathered layer by resizing its storage to zero (`storage.resize_`),
  which no operator dispatch shows; routing FSDP2's own alloc/free helpers through a tensor ledger makes
  gathered parameters count only while they are gathered; and, where the ledger records events for the
  allocator replay, it marks which stream each allocation is made on (FSDP2 allocates its all-gather
  buffers on a copy-in stream and its sharded gradients on a reduce-scatter stream, whose blocks the caching
  allocator keeps apart from the default stream's: an H100 allocator trace of a llama-3.2-1b rank at world 8
  is replayed to its measured `peak_reserved` only with the streams kept apart).
LoRA: the frozen base weights are sharded with the adapters in the same decoder-layer units.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

HALF = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}


def precision_policy(precision: str) -> Any:
    """FSDP2's MixedPrecisionPolicy for a trainmem precision flag (see the module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision in HALF:
        return MixedPrecisionPolicy(param_dtype=HALF[precision], reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # fp32, bf16, fp16: the weights' own dtype throughout


def policy_words(precision: str) -> str:
    """`precision_policy` in words, for a row's notes."""
    if precision in HALF:
        half = "bf16" if HALF[precision] == torch.bfloat16 else "fp16"
        return f"fp32 sharded master weights, {half} compute parameters, fp32 gradient reduction"
    return f"{precision} weights, compute and reduction"


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


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards as units: the classes the model names in `_no_split_modules`."""
    names: set[str] = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, world: int, precision: str, device_type: str) -> torch.nn.Module:
    """`fully_shard` every decoder layer, then the root, over a 1-D mesh of `world` ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (world,))
    policy = precision_policy(precision)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def wrap(model: torch.nn.Module, shard: str, world: int, precision: str = "fp32") -> torch.nn.Module:
    """A CPU rank's model as `--shard` spreads it: DDP, or FSDP2 (`shard_model`)."""
    if shard == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    return shard_model(model, world, precision, "cpu")


@contextlib.contextmanager
def follow_fsdp_storage(ledger: Any) -> Iterator[None]:
    """Route FSDP2's alloc_storage/free_storage (module-level helpers) through `ledger.resized`, so that
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
        with _follow_streams(ledger) if getattr(ledger, "events", None) is not None else contextlib.nullcontext():
            yield
    finally:
        _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
        _fsdp_param.free_storage = free
        _fsdp_param.FSDPParam.init_all_gather_outputs = init_outputs


@contextlib.contextmanager
def _follow_streams(ledger: Any) -> Iterator[None]:
    """Mark in `ledger` the stream FSDP2 allocates on: its collectives enter `torch.cpu.stream(s)` (the device
    handle of the simulation's CPU mesh) around their buffers. Streams are numbered in the order they are
    entered; the default stream is 0."""
    import torch.cpu

    original = torch.cpu.stream
    default = torch.cpu.current_stream()
    numbers: dict[int, int] = {}
    current = [0]

    @contextlib.contextmanager
    def stream(s: Any) -> Iterator[None]:
        number = 0 if s is None or s is default else numbers.setdefault(id(s), len(numbers) + 1)
        before = current[0]
        if number != before:
            ledger.use_stream(number)
        current[0] = number
        try:
            with original(s):
                yield
        finally:
            current[0] = before
            if number != before:
                ledger.use_stream(before)

    torch.cpu.stream = stream
    try:
        yield
    finally:
        torch.cpu.stream = original


__all__ = ["HALF", "precision_policy", "policy_words", "fake_group", "decoder_layers", "shard_model", "wrap",
           "follow_fsdp_storage"]
