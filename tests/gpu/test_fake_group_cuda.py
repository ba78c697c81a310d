"""One rank of an 8-GPU FSDP2 run measured on one GPU through the fake process group (issue 17).

Pins rank 3's weights, gradients and optimizer states against a hand-computed shard: ceil(dim0 / 8) rows of
every parameter (FSDP2's padded chunk) x bytes."""

from __future__ import annotations

import math

import pytest
import torch

from trainmem import ModelSpec, TrainSetup
from trainmem.isolation.engines import execute

pytestmark = pytest.mark.gpu
SPEC = ModelSpec.resolve("tiny-llama")


@pytest.mark.parametrize("precision,wbytes", [("amp-bf16", 4), ("bf16", 2), ("fp32", 4)])
def test_rank_of_eight_on_one_gpu_holds_its_shard(precision, wbytes):
    from transformers import AutoModelForCausalLM

    r = execute(SPEC, TrainSetup(batch_size=2, seq_len=128, steps=2, num_samples=16, device="cuda",
                                 precision=precision, gpus=8, shard="fsdp", rank=3))
    assert r.status == "ok", r.error
    assert r.env["emulated_world"] == 8 and r.env["rank"] == 3 and r.env["backend"] == "fake"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(SPEC.hf_config())
    params = list(model.parameters())
    shard = sum(math.ceil(p.shape[0] / 8) * (p.numel() // p.shape[0]) for p in params)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    # amp-bf16: fp32 sharded master weights and fp32 sharded gradients (reduce_dtype fp32)
    assert r.model_states["weights"] == wbytes * shard + buffers
    assert r.model_states["gradients"] == wbytes * shard
    assert r.model_states["optimizer"] == 2 * wbytes * shard + 4 * len(params)
    assert r.memory["peak_allocated"] > r.model_states["weights"]
