"""`estimate --gpus N --shard fsdp` simulated: FSDP2 under the fake process group on fake CPU tensors,
checked against the sharding formulas and against a real fake-group run of the same tiny setup."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate
from trainmem.estimator.memory.sharded import simulate_fsdp_rank
from trainmem.estimator.memory.sharding import rank_states
from trainmem.isolation.engines import execute

SPEC = ModelSpec.resolve("tiny-gpt-neox")
# eager attention: the CPU run and the simulation take the same attention path (simulate would model
# CUDA's flash kernel for sdpa, which the CPU does not run)
BASE = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu", precision="fp32", shard="fsdp",
            attention="eager")


@pytest.mark.parametrize("world", [2, 8])
def test_simulated_rank_states_equal_the_formulas(world):
    pytest.importorskip("torch.distributed.fsdp")
    _, final = simulate_fsdp_rank(SPEC, TrainSetup(gpus=world, **BASE), "fp32")
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        params = list(AutoModelForCausalLM.from_config(SPEC.hf_config()).parameters())
    psi = sum(p.numel() for p in params)
    assert all(p.shape[0] % world == 0 for p in params)  # no FSDP2 padding for this model
    f = rank_states(4 * psi, 4 * psi, 8 * psi + 4 * len(params), psi, False, world, "fsdp", "none", 0, False,
                    unsharded_optimizer=4 * len(params))
    assert final.gradients == f.gradients == 4 * psi // world
    assert final.optimizer == f.optimizer
    assert not dist.is_initialized()


@pytest.mark.parametrize("world,kw", [(2, {}), (8, {}), (2, {"checkpointing": True})])
def test_simulated_estimate_agrees_with_a_fake_group_cpu_run(world, kw):
    setup = TrainSetup(gpus=world, **BASE, **kw)
    b = estimate(SPEC, setup)  # auto: simulated for FSDP
    assert b.method == "simulate" and any("rank 0 of" in n for n in b.notes)
    r = execute(SPEC, setup.replace(rank=0))
    assert r.status == "ok", r.error
    for part in ("weights", "gradients", "optimizer", "activations"):
        assert b.memory[part] == r.memory[part], part
    # the states one rank holds, not the whole model's: gradients and moments exactly (no padding here);
    # the rank's weights also hold the unsharded buffers (rotary inv_freq), which the formula leaves out
    assert b.model_states["gradients"] == r.model_states["gradients"]
    assert b.model_states["optimizer"] == r.model_states["optimizer"]
    assert 0 <= r.model_states["weights"] - b.model_states["weights"] < 4096
    # the simulation adds the two cuBLAS workspaces a CUDA run allocates (the CPU has none), and its
    # `peak_allocated` counts CUDA's allocator blocks (the CPU has none): its peak as requested, less the
    # workspaces, is the CPU run's within 64 bytes (a few scalar tensors outside the model step, e.g. the token count)
    assert b.memory["peak_allocated"] >= b.terms["simulated_peak"]
    gap = b.terms["simulated_peak"] - b.terms["cublas_workspace"] - r.memory["peak_allocated"]
    assert abs(gap) <= 64, gap


def test_simulated_lora_estimate_differs_from_the_cpu_run_by_the_dropout_masks_only():
    setup = TrainSetup(gpus=2, peft="lora", **BASE)
    b = estimate(SPEC, setup)
    r = execute(SPEC, setup.replace(rank=0))
    assert r.status == "ok", r.error
    # LoRA's dropout on each adapted input: CUDA's fused kernel keeps a 1-byte mask, the CPU a 4-byte one
    mask = 3 * setup.batch_size * setup.seq_len * SPEC.hf_config().hidden_size  # per adapted qkv input
    gap = r.memory["activations"] - b.memory["activations"]
    assert gap > 0 and gap % mask == 0, gap  # a whole number of masks live at the peak
    assert abs(r.memory["peak_allocated"] + b.terms["cublas_workspace"] - b.terms["simulated_peak"] - gap) <= 64


def test_two_estimates_in_one_process_leave_no_group_behind():
    a = estimate(SPEC, TrainSetup(gpus=2, **BASE))
    b = estimate(SPEC, TrainSetup(gpus=2, **BASE))
    assert not dist.is_initialized()
    assert a.memory == b.memory


def test_zero_and_offload_stay_analytic_and_say_how_far_they_are_checked():
    b = estimate(SPEC, TrainSetup(gpus=2, **{**BASE, "shard": "zero3"}), "simulate")
    assert b.method == "analytic" and any("ten DeepSpeed ZeRO ranks measured on one H100 and held out" in n for n in b.notes)
    b = estimate(SPEC, TrainSetup(gpus=2, offload="optimizer", **BASE), "simulate")
    assert b.method == "analytic" and any("unvalidated" in n for n in b.notes)


def test_a_zero3_rank_keeps_deepspeeds_live_parameters_gathered():
    """DeepSpeed ZeRO-3 keeps up to `stage3_max_live_parameters` (1e9) gathered: the whole of a small model, 1e9
    elements of a large one; and a ZeRO rank's reserved bytes take DeepSpeed's own ratio to allocated."""
    from trainmem.estimator.memory import runtime, sharding

    small = estimate(SPEC, TrainSetup(gpus=8, **{**BASE, "shard": "zero3", "precision": "bf16"}))
    one = estimate(SPEC, TrainSetup(**{**BASE, "shard": "none", "precision": "bf16"}))
    assert small.terms["gathered_units"] == one.model_states["weights"]
    assert small.memory["peak_reserved"] == int(small.memory["peak_allocated"] * runtime.DEEPSPEED_RESERVED_OVER_ALLOCATED)
    big = estimate("llama-3.2-1b", TrainSetup(gpus=8, shard="zero3", precision="bf16", batch_size=1, seq_len=128), "analytic")
    assert abs(big.terms["gathered_units"] - sharding.ZERO3_MAX_LIVE * 2) <= 0.01 * sharding.ZERO3_MAX_LIVE * 2


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
def test_a_zero_rank_keeps_an_fp32_partition_whatever_the_weights(precision):
    """DeepSpeed's ZeRO optimizer steps an fp32 copy of the rank's partition beside Adam's two fp32 moments, over
    bf16 weights and over fp32 ones alike: 12 bytes per trainable parameter over N (test_deepspeed.py measures it)."""
    b = estimate(SPEC, TrainSetup(gpus=4, **{**BASE, "shard": "zero2", "precision": precision}))
    assert b.model_states["optimizer"] == 12 * b.model["trainable_parameters"] // 4


def test_analytic_fsdp_closed_form_is_checked_against_simulate():
    # amp-bf16: FSDP2 gathers bf16 weights itself, so no autocast weight copies and half-size gathered units
    setup = TrainSetup(gpus=2, batch_size=4, seq_len=256, precision="amp-bf16", shard="fsdp")
    a, s = estimate("tiny-llama", setup, "analytic"), estimate("tiny-llama", setup, "simulate")
    assert "autocast_weight_copies" not in a.terms and s.method == "simulate"
    assert abs(a.memory["peak_allocated"] / s.memory["peak_allocated"] - 1) < 0.03
    assert a.memory["optimizer"] == s.memory["optimizer"]  # sharded fp32 moments + whole step scalars


def test_the_simulated_rank_allocates_gathers_and_gradient_shards_on_their_own_streams():
    """FSDP2's all-gather buffers (copy-in stream) and reduce-scatter outputs (its stream) are recorded on streams
    apart from the default one, as an H100 trace of a rank shows them; the replay keeps their blocks apart."""
    from trainmem.estimator.memory.allocator import replay
    from trainmem.measure.ledger import STREAM

    ledger, _ = simulate_fsdp_rank(SPEC, TrainSetup(gpus=4, **BASE), "fp32")
    events = ledger.events or []
    streams = [n for k, n in events if k == STREAM]
    assert {0, 1, 2} <= set(streams)  # default, all-gather copy-in, reduce-scatter (and the all-gather's own)
    on = dict.fromkeys(streams, 0)
    stream = 0
    for k, n in events:
        if k == STREAM:
            stream = n
        elif isinstance(k, int) and n > 0:
            on[stream] += n
    assert on[0] > 0 and sum(1 for k, n in on.items() if k and n) == 2  # copy-in and reduce-scatter allocate
    apart = replay(events).peak_reserved
    together = replay([(k, n) for k, n in events if k != STREAM]).peak_reserved
    assert apart >= together


def test_the_simulated_build_is_the_measured_rank_load():
    """Both start from the sharded model: the simulation materialises its rank's shards with `to_empty` on fake
    tensors, the measured rank on real ones (then initialises them), so no whole model counts in either."""
    setup = TrainSetup(gpus=8, **BASE)
    ledger, _ = simulate_fsdp_rank(SPEC, setup, "fp32")
    live = peak = 0
    sizes: dict = {}
    for key, n in ledger.events[:ledger.marks["step1.micro1.forward"]]:  # the build, before the first forward
        if n == -1:
            live -= sizes.pop(key)
        elif key != "empty_cache":
            sizes[key] = n
            live += n
            peak = max(peak, live)
    r = execute(SPEC, setup.replace(rank=0))
    assert r.status == "ok", r.error
    load = next(p for p in r.phases if p["phase"] == "load")
    assert live == load["weights"] == load["allocated"]  # the shards and the buffers, nothing else left
    # the measured load also recomputes the rotary table (a few temporaries of head_dim / 2 floats)
    assert 0 <= load["peak_allocated"] - peak <= 1024


@pytest.mark.parametrize("shard,offload", [("zero2", "optimizer"), ("zero3", "params"), ("fsdp", "optimizer")])
def test_offload_says_the_host_memory_each_rank_and_node_needs(shard, offload):
    """What `--offload` moves off the GPU lands in host RAM: the rank's share of the optimizer states (plus the fp32
    gradient partition ZeRO-Offload steps on the CPU), or its parameter shard; a node holds its ranks' shares."""
    setup = TrainSetup(gpus=8, nodes=2, shard=shard, offload=offload, precision="bf16", batch_size=2, seq_len=32)
    one = estimate(SPEC, setup.replace(gpus=1, nodes=1, shard="none", offload="none"), "analytic")
    b = estimate(SPEC, setup, "analytic")
    trainable = b.model["trainable_parameters"]
    n = 4 if shard == "fsdp" else 8  # FSDP over two nodes is HSDP: sharded within a node; ZeRO over all 8
    # the optimizer's share in either case: parameter offload steps the optimizer on the CPU as well
    moments = 12 * trainable if shard.startswith("zero") else one.model_states["optimizer"]
    expected = moments // n + (4 * trainable // n if shard.startswith("zero") else 0)
    if offload == "params":
        expected += one.model_states["weights"] // n
        assert b.model_states["optimizer"] == 0 and b.model_states["weights"] == 0
    # FSDP's rank keeps torch AdamW's unsharded step scalars whole; ZeRO's formulas take the rest to 1/N
    assert abs(b.terms["host_memory_per_rank"] - expected) <= 4 * 64
    assert any(f"{4 * b.terms['host_memory_per_rank'] / 2**30:.1f} GiB for the 4 ranks of a node" in n for n in b.notes)
