"""Data-parallel runs as 2 CPU processes over gloo (DDP and FSDP2), per-rank bytes checked exactly."""

from __future__ import annotations

import math

import pytest
import torch

from trainmem import ModelSpec, SetupError, TrainSetup
from trainmem.estimator.memory.sharding import rank_states
from trainmem.isolation.engines import execute

SPEC = ModelSpec.resolve("tiny-gpt-neox")
BASE = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def single():
    return execute(SPEC, TrainSetup(**BASE))


def ranked(shard):
    r = execute(SPEC, TrainSetup(gpus=2, shard=shard, **BASE))
    assert r.status == "ok", r.error
    assert len(r.ranks) == 2 and [k["rank"] for k in r.ranks] == [0, 1]
    assert r.memory == max((k["memory"] for k in r.ranks), key=lambda m: m["peak_allocated"])
    for k in r.ranks:
        m = k["memory"]
        assert m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["other"] == m["peak_allocated"]
    return r


def test_ddp_keeps_full_states_per_rank(single):
    r = ranked("ddp")
    for k in r.ranks:
        assert k["model_states"] == single.model_states  # weights, gradients, optimizer: full on each rank
        # the reducer's gradient buckets: one more copy of the gradients (rank_states' DDP term)
        assert k["memory"]["peak_allocated"] >= single.memory["peak_allocated"]
    assert r.effective_batch == 2 * 2


def test_fsdp2_shards_states_as_the_formulas_say(single):
    from transformers import AutoModelForCausalLM

    r = ranked("fsdp")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(SPEC.hf_config())
    params = list(model.parameters())
    buffers = sum(b.numel() * 4 for b in model.buffers())
    # FSDP2 splits dim 0 of each parameter in 2 chunks, padding to ceil(dim0 / 2) rows on every rank
    shard = sum(math.ceil(p.shape[0] / 2) * (p.numel() // p.shape[0]) * 4 for p in params)
    steps = 4 * len(params)  # AdamW's scalar `step` per parameter is not sharded
    s = single.model_states
    formula = rank_states(s["weights"], s["gradients"], s["optimizer"], sum(p.numel() for p in params),
                          False, 2, "fsdp", "none", 0, False)
    for k in r.ranks:
        got = k["model_states"]
        assert got == {"weights": shard + buffers, "gradients": shard, "optimizer": 2 * shard + steps}
        padding = shard - sum(p.numel() for p in params) * 4 // 2
        assert abs(got["weights"] - formula.weights) <= padding + buffers
        assert abs(got["gradients"] - formula.gradients) <= padding
        assert abs(got["optimizer"] - formula.optimizer) <= 2 * padding + steps
    assert r.memory["peak_allocated"] < single.memory["peak_allocated"]


def test_what_is_not_built_says_so():
    with pytest.raises(SetupError, match="add --engine deepspeed"):
        execute(SPEC, TrainSetup(gpus=2, shard="zero2", **BASE))
    with pytest.raises(SetupError, match="fewer than one per rank"):
        execute(SPEC, TrainSetup(gpus=2, shard="ddp", **{**BASE, "num_samples": 2}))
