"""One rank of an N-rank FSDP2 run in this process through PyTorch's fake process group, on CPU tensors:
per-rank states checked exactly against the sharding formulas, as test_distributed.py does for gloo."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from trainmem import ModelSpec, SetupError, TrainSetup
from trainmem.estimator.memory.sharding import rank_states
from trainmem.fsdp import precision_policy
from trainmem.isolation.engines import execute

SPEC = ModelSpec.resolve("tiny-gpt-neox")
BASE = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu", precision="fp32", shard="fsdp")


def _meta_model(peft: bool = False):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(SPEC.hf_config())


@pytest.mark.parametrize("world,rank", [(2, 1), (8, 5)])
def test_emulated_rank_states_equal_the_formulas(world, rank):
    r = execute(SPEC, TrainSetup(gpus=world, rank=rank, **BASE))
    assert r.status == "ok", r.error
    assert not dist.is_initialized()  # the fake group is destroyed with the run
    assert r.env["backend"] == "fake" and r.env["emulated_world"] == world and r.env["rank"] == rank
    assert any("not measured: NCCL" in n for n in r.notes)
    params = list(_meta_model().parameters())
    psi = sum(p.numel() for p in params)
    # tiny-gpt-neox: every parameter's dim 0 divides by 2 and 8, so FSDP2 adds no padding
    assert all(p.shape[0] % world == 0 for p in params)
    buffers = sum(b.numel() * 4 for b in _meta_model().buffers())
    single = {"weights": 4 * psi, "gradients": 4 * psi, "optimizer": 8 * psi + 4 * len(params)}
    f = rank_states(single["weights"], single["gradients"], single["optimizer"], psi, False, world, "fsdp",
                    "none", 0, False, unsharded_optimizer=4 * len(params))
    got = r.model_states
    assert got["gradients"] == f.gradients == 4 * psi // world
    assert got["optimizer"] == f.optimizer == 8 * psi // world + 4 * len(params)  # AdamW's step: whole
    assert got["weights"] == f.weights + buffers
    m = r.memory
    assert m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["other"] == m["peak_allocated"]


def test_rank_all_runs_each_rank_and_the_worst_is_the_top_level():
    r = execute(SPEC, TrainSetup(gpus=2, rank="all", **BASE))
    assert r.status == "ok", r.error
    assert [k["rank"] for k in r.ranks] == [0, 1] and r.env["emulated_world"] == 2
    assert r.memory == max((k["memory"] for k in r.ranks), key=lambda m: m["peak_allocated"])
    # ranks of one shape differ only in which chunk they hold: the same bytes
    assert r.ranks[0]["model_states"] == r.ranks[1]["model_states"]


def test_lora_on_fsdp2_shards_the_frozen_base_and_trains_the_adapters():
    r = execute(SPEC, TrainSetup(gpus=2, rank=0, peft="lora", checkpointing=True, **BASE))
    assert r.status == "ok", r.error
    from trainmem.measure.build import build_model

    model = build_model(SPEC, TrainSetup(peft="lora", device="cpu", precision="fp32"), "cpu", "fp32")
    adapters = [p for p in model.parameters() if p.requires_grad]
    lora = sum(p.numel() for p in adapters)
    pad = sum((math.ceil(p.shape[0] / 2) * 2 - p.shape[0]) * (p.numel() // p.shape[0]) for p in adapters)
    assert r.model_states["gradients"] == 4 * (lora + pad) // 2
    assert r.model_states["optimizer"] == 8 * (lora + pad) // 2 + 4 * len(adapters)
    every = sum(p.numel() for p in model.parameters())
    assert r.model_states["weights"] < 4 * every * 0.6  # the frozen base is sharded too


def test_precision_flags_map_to_mixed_precision_policies():
    amp = precision_policy("amp-bf16")
    assert amp.param_dtype == torch.bfloat16 and amp.reduce_dtype == torch.float32
    assert precision_policy("amp-fp16").param_dtype == torch.float16
    for p in ("fp32", "bf16"):
        assert precision_policy(p).param_dtype is None and precision_policy(p).reduce_dtype is None


def test_rank_errors_name_the_flag_and_the_fix():
    with pytest.raises(SetupError, match=r"--rank 8: out of range for --gpus 8; use 0..7 or all"):
        TrainSetup(gpus=8, rank=8, **BASE).validate()
    with pytest.raises(SetupError, match=r"--rank 0: .*needs --gpus N \(N >= 2\) and --shard fsdp"):
        TrainSetup(gpus=2, rank=0, **{**BASE, "shard": "ddp"}).validate()


def test_an_existing_process_group_is_not_silently_reused():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainmem.fsdp import fake_group

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with pytest.raises(RuntimeError, match="already initialised"):
            with fake_group(0, 2):
                pass
    finally:
        dist.destroy_process_group()
    with fake_group(1, 4):
        assert dist.get_rank() == 1 and dist.get_world_size() == 4
    assert not dist.is_initialized()


def test_cli_runs_one_emulated_rank_and_rejects_a_rank_out_of_range():
    import json
    import subprocess
    import sys

    cli = [sys.executable, "-m", "trainmem.cli", "run", "--model", "tiny-gpt-neox", "--batch-size", "2",
           "--seq-len", "32", "--steps", "2", "--num-samples", "8", "--device", "cpu", "--gpus", "4",
           "--shard", "fsdp"]
    p = subprocess.run(cli + ["--rank", "2", "--json"], capture_output=True, text=True, check=True)
    row = json.loads(p.stdout)
    assert row["status"] == "ok" and row["env"]["emulated_world"] == 4 and row["env"]["rank"] == 2
    assert row["setup"]["rank"] == 2
    bad = subprocess.run(cli + ["--rank", "4"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--rank 4: out of range for --gpus 4; use 0..3 or all" in bad.stdout + bad.stderr


def test_amp_bf16_keeps_fp32_master_shards_and_fp32_gradient_shards():
    r = execute(SPEC, TrainSetup(gpus=2, rank=0, **{**BASE, "precision": "amp-bf16"}))
    assert r.status == "ok", r.error
    params = list(_meta_model().parameters())
    psi = sum(p.numel() for p in params)
    buffers = sum(b.numel() * 4 for b in _meta_model().buffers())
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): fp32 shards, bf16 only while gathered
    assert r.model_states == {"weights": 4 * psi // 2 + buffers, "gradients": 4 * psi // 2,
                              "optimizer": 8 * psi // 2 + 4 * len(params)}
    assert any("fp32 sharded master weights, bf16 compute parameters, fp32 gradient reduction" in n
               for n in r.notes)


def _shard_elements(params, world):
    """FSDP2's padded chunk: ceil(dim0 / world) rows of every parameter."""
    return sum(math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0]) for p in params)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe"])
def test_a_meta_built_rank_materialises_only_its_shard_and_trains(name):
    from trainmem.measure.build import build_model

    spec = ModelSpec.resolve(name)
    r = execute(spec, TrainSetup(gpus=4, rank=1, **BASE))
    assert r.status == "ok", r.error
    assert len(r.losses) == 2 and all(math.isfinite(l) for l in r.losses)
    assert any("built on the meta device" in n for n in r.notes)
    meta = build_model(spec, TrainSetup(device="cpu", precision="fp32"), "meta", "fp32")
    params = list(meta.parameters())
    psi = sum(p.numel() for p in params)
    shard = _shard_elements(params, 4)
    assert shard == psi // 4  # these shapes divide by 4: the formulas hold without padding
    buffers = sum(b.numel() * 4 for b in meta.buffers())
    f = rank_states(4 * psi, 4 * psi, 8 * psi + 4 * len(params), psi, False, 4, "fsdp", "none", 0, False,
                    unsharded_optimizer=4 * len(params))
    assert r.model_states["gradients"] == f.gradients == 4 * shard
    assert r.model_states["optimizer"] == f.optimizer == 8 * shard + 4 * len(params)
    load = next(p for p in r.phases if p["phase"] == "load")
    assert load["weights"] == 4 * shard + buffers == f.weights + buffers  # 1/N of the model at load
    # the load counts from the start: no whole model was ever allocated, only the shards and the
    # initialisation's few temporaries (a rotary table recomputed)
    assert 4 * shard + buffers <= load["peak_allocated"] < 4 * shard + buffers + 1024 < 4 * psi / 3


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe"])
def test_meta_and_whole_then_shard_ranks_peak_alike_after_the_load(name):
    """The whole-then-shard build (QLoRA's rank, and every rank before) restarted its peak after sharding; the
    meta build counts from the start. After the load they differ only by what the on-device build leaves alive
    beyond the weights (a few scalar bytes), which the meta build never makes."""
    from trainmem.fsdp import fake_group
    from trainmem.measure.fake_rank import measure_rank_here

    spec, setup = ModelSpec.resolve(name), TrainSetup(gpus=4, rank=1, **BASE)
    rows = {}
    for on_meta in (True, False):
        with fake_group(1, 4):
            rows[on_meta] = measure_rank_here(spec, setup, "cpu", "fp32", 1, 4, {}, on_meta=on_meta)
    meta, whole = rows[True], rows[False]
    assert meta.status == whole.status == "ok", (meta.error, whole.error)
    assert meta.model_states == whole.model_states
    left = {k: next(p for p in r.phases if p["phase"] == "load") for k, r in rows.items()}
    extra = {k: p["allocated"] - p["weights"] for k, p in left.items()}  # live after the load beyond the weights
    assert extra[True] == 0 and 0 <= extra[False] <= 64
    assert left[False]["peak_allocated"] < 2 * left[False]["weights"]  # the restart forgot the whole build
    for phase_meta, phase_whole in zip(meta.phases[1:], whole.phases[1:], strict=True):
        assert phase_whole["peak_allocated"] - phase_meta["peak_allocated"] == extra[False]
    assert whole.memory["peak_allocated"] - meta.memory["peak_allocated"] == extra[False]
