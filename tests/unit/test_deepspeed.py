"""One rank of a DeepSpeed ZeRO run through the fake process group on CPU tensors (`trainmem.measure.deepspeed`):
the rank's optimizer states are DeepSpeed's mixed-precision ones (fp32 master weights and Adam's two moments,
12 bytes per trainable parameter, sharded over the world), its weights whole under ZeRO-1/2 and a 1/N partition
under ZeRO-3. Skipped where DeepSpeed is not installed (CI does not install it)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from trainmem import ModelSpec, SetupError, TrainSetup
from trainmem.isolation.engines import execute

pytest.importorskip("deepspeed")

SPEC = ModelSpec.resolve("tiny-llama")
BASE = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu", precision="bf16", engine="deepspeed")
ALIGN = 2 * 4 * 8  # DeepSpeed pads each rank's flat partition to an alignment (bytes here, fp32, per group)


@pytest.mark.parametrize("shard,world,rank", [("zero1", 4, 1), ("zero2", 2, 0), ("zero3", 4, 3)])
def test_a_zero_rank_keeps_its_share(shard, world, rank):
    r = execute(SPEC, TrainSetup(gpus=world, shard=shard, rank=rank, **BASE))
    assert r.status == "ok", r.error
    assert not dist.is_initialized()
    assert r.env["backend"] == "fake" and r.env["rank"] == rank and r.env["deepspeed"]
    assert all(l == l for l in r.losses)  # finite: the step ran (DeepSpeed skips a step on a non-finite gradient)
    psi = SPEC.parameter_count
    ms = r.model_states
    assert abs(ms["optimizer"] - 12 * psi // world) <= world * ALIGN
    if shard == "zero3":
        # within 1%: the norms (under stage3_param_persistence_threshold, 10 * hidden) stay whole, and buffers
        assert abs(ms["weights"] - 2 * psi // world) <= 0.01 * 2 * psi // world
    else:
        assert ms["weights"] == 2 * psi + sum(b.numel() * b.element_size() for b in _buffers())
    assert r.memory["peak_allocated"] >= sum(ms.values())
    assert ms["gradients"] == 0  # DeepSpeed's step sets every gradient to None; the estimate says the same


@pytest.mark.parametrize("precision", ["amp-bf16", "fp32"])
def test_fp32_weights_get_an_fp32_partition_too(precision):
    """Over fp32 weights DeepSpeed still steps a `.clone().float()` of the rank's partition: 12 bytes per parameter
    over N, as over bf16 weights, and the estimate's rank states say the same."""
    from trainmem import estimate

    setup = TrainSetup(gpus=2, shard="zero2", rank=0, **{**BASE, "precision": precision})
    r = execute(SPEC, setup)
    assert r.status == "ok", r.error
    assert abs(r.model_states["optimizer"] - estimate(SPEC, setup).model_states["optimizer"]) <= 2 * ALIGN


def test_a_zero3_rank_leaves_torch_as_it_found_it():
    """DeepSpeed's ZeRO-3 engine swaps `torch.nn.functional.linear` for its own autograd function and leaves it
    so; an estimate later in the process would count its kernels and saved tensors. The engine puts it back."""
    import torch.nn.functional as F

    linear = F.linear
    r = execute(SPEC, TrainSetup(gpus=4, shard="zero3", rank=1, **BASE))
    assert r.status == "ok", r.error
    assert F.linear is linear


def test_every_rank_in_turn_and_offload():
    r = execute(SPEC, TrainSetup(gpus=2, shard="zero3", rank="all", offload="params", **BASE))
    assert r.status == "ok", r.error
    assert [row["rank"] for row in r.ranks] == [0, 1]


def test_what_the_engine_refuses():
    with pytest.raises(SetupError, match="--engine deepspeed: runs a DeepSpeed ZeRO rank"):
        execute(SPEC, TrainSetup(gpus=2, shard="fsdp", **BASE))
    with pytest.raises(SetupError, match="--precision fp16: the DeepSpeed engine"):
        execute(SPEC, TrainSetup(gpus=2, shard="zero2", **{**BASE, "precision": "fp16"}))


def _buffers():
    from transformers import AutoModelForCausalLM
    import torch

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(SPEC.hf_config(), dtype=torch.bfloat16)
    return [b for b in model.buffers()]

