"""`estimate --shard zero1|zero2`: a ZeRO-1/2 rank's forward and backward priced from the same micro-batches'
simulated step on one GPU (`estimator/memory/zero.py`), its states from DeepSpeed's partitioning."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate, simulated_step
from trainmem.estimator.memory import zero
from trainmem.estimator.memory.simulate import model_builder, simulate_step
from trainmem.estimator.memory.states import inventory
from trainmem.hardware.gpus import find_gpu

H100 = find_gpu("H100")
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
         "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
         "max_position_embeddings": 256, "tie_word_embeddings": False}


def _single_excess(spec: ModelSpec, setup: TrainSetup, whole_gradients: bool = False) -> zero.Excess:
    single = zero.single_gpu(setup.validate(spec))
    precision = single.resolved_precision(spec, "cuda")
    ledger, _ = simulate_step(model_builder(spec, single, precision, H100), single, precision,
                              workspace=H100.cublas_workspace, flash=H100.flash, sms=H100.sms, splits=True)
    return zero.excess(ledger, whole_gradients)


@pytest.mark.parametrize("shard,world", [("zero1", 2), ("zero2", 4)])
def test_a_zero_rank_is_its_states_plus_one_gpus_forward_and_backward(shard, world):
    """The rank's peak is the allocator replay's of its own events; at that moment it holds every weight (stages 1
    and 2 keep them whole), its partition of the fp32 master weights and moments, and one GPU's forward and backward
    of the same micro-batch (ZeRO-1: with each gradient whole until the backward's end): the sum the states and the
    single-GPU step's excess make, to the rounding of the allocator's blocks and DeepSpeed's gradient bucket."""
    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(gpus=world, shard=shard, precision="bf16", batch_size=4, seq_len=128, gpu="H100")
    b = estimate(spec, setup)
    one = estimate(spec, TrainSetup(precision="bf16", batch_size=4, seq_len=128, gpu="H100"))
    found = _single_excess(spec, setup, whole_gradients=shard == "zero1")
    trainable = b.model["trainable_parameters"]
    assert b.method == "simulate" and b.peak_phase == "forward/backward"
    assert b.memory["weights"] == one.model_states["weights"]
    assert b.memory["optimizer"] == 12 * trainable // world
    assert (b.memory["gradients"], b.memory["activations"]) == (found.gradients, found.activations)
    parts = ("weights", "gradients", "optimizer", "activations", "other")
    assert b.memory["peak_allocated"] == sum(b.memory[k] for k in parts) == _rank_allocated(spec, setup)
    bucket = 2 * spec.hf_config().hidden_size ** 2
    accounted = b.memory["weights"] + b.memory["optimizer"] + found.bytes
    blocks = len(simulated_step(spec, setup.validate(spec), "bf16", H100).events)
    assert 0 <= b.memory["peak_allocated"] - accounted <= bucket + 512 * blocks
    assert any(n.startswith("ZeRO-1/2: peak allocated and reserved from the allocator replay") for n in b.notes)


def test_a_zero1_rank_holds_its_whole_gradients_at_its_backwards_end():
    """A short micro-batch peaks where the backward ends: a ZeRO-1 rank then holds its gradients whole (DeepSpeed
    frees those outside its partition only after it); a ZeRO-2 rank peaks in its optimizer step with its partition's."""
    spec = ModelSpec.resolve("tiny-llama")
    kw = dict(gpus=8, precision="bf16", batch_size=1, seq_len=16, checkpointing=True, gpu="H100")
    one, two = (estimate(spec, TrainSetup(shard=shard, **kw)) for shard in ("zero1", "zero2"))
    assert one.peak_phase == "forward/backward" and two.peak_phase == "optimizer step"
    # most of them: the embedding's, the backward's last, is being computed at the peak
    whole = 2 * one.model["trainable_parameters"]  # bf16
    assert 0 < two.memory["gradients"] < one.memory["gradients"] <= whole


def test_accumulation_keeps_the_ranks_gradients_through_the_window():
    spec = ModelSpec.resolve("tiny-llama")
    kw = dict(gpus=4, shard="zero2", precision="bf16", batch_size=2, seq_len=64, gpu="H100")
    one, two = (estimate(spec, TrainSetup(**kw, grad_accum=k)) for k in (1, 2))
    assert one.memory["gradients"] == 0
    sizes = [p.numel for p in inventory(spec, TrainSetup(**kw).validate(spec), "bf16").params if p.trainable]
    _, overlaps, _ = zero.partition_of(sizes, 4)
    # the partition buffer: every parameter that overlaps the fullest rank's partition, whole, in bf16
    assert two.memory["gradients"] == 2 * overlaps[zero.optimizer_step(sizes, 4, 2, foreach=True).rank]
    # after the step DeepSpeed has set every gradient to None, as a measured rank reports them
    assert one.model_states["gradients"] == two.model_states["gradients"] == 0


def test_cut_models_extend_to_the_whole_models_excess(tmp_path):
    """A deep model's excess from three cut models equals its whole simulation's, allocation for allocation."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    setup = TrainSetup(gpus=2, shard="zero2", precision="bf16", batch_size=2, seq_len=64, checkpointing=True,
                       gpu="H100").validate(spec)
    def cuts_only(k):
        assert k is not None  # the whole model is not simulated where the cuts extend
        single = zero.single_gpu(setup)
        return simulate_step(model_builder(spec.cut(k), single, "bf16", H100), single, "bf16",
                             workspace=H100.cublas_workspace, flash=H100.flash, sms=H100.sms, splits=True)[0]

    composed = simulated_step(spec, setup, "bf16", H100)
    assert zero.rank_excess(spec.config, 26, cuts_only) == composed
    assert composed == _single_excess(spec, setup)  # the whole model simulated


def test_zero3_qlora_and_parameter_offload_stay_analytic():
    spec = ModelSpec.resolve("tiny-llama")
    for kw in (dict(shard="zero3"), dict(shard="zero3", offload="params")):
        assert estimate(spec, TrainSetup(gpus=2, precision="bf16", **kw)).method == "analytic"
    assert not zero.simulates(TrainSetup(gpus=2, shard="zero2", peft="qlora"))
    assert zero.simulates(TrainSetup(gpus=2, shard="zero2", offload="optimizer"))


def test_zero_offload_stages_gradients_in_a_buffer_of_the_largest_parameter():
    """ZeRO-1/2 with optimizer offload keeps `temp_grad_buffer_for_gpu_offload` on the GPU, as large as the
    largest trainable parameter in the weights' dtype (DeepSpeed's stage_1_and_2.py), beside no optimizer states."""
    import torch
    from transformers import AutoModelForCausalLM

    spec = ModelSpec.resolve("tiny-llama")
    with torch.device("meta"):
        largest = max(p.numel() for p in AutoModelForCausalLM.from_config(spec.hf_config()).parameters()) * 2
    kw = dict(gpus=4, shard="zero2", precision="bf16", batch_size=2, seq_len=64, gpu="H100")
    on, off = estimate(spec, TrainSetup(**kw, offload="optimizer")), estimate(spec, TrainSetup(**kw))
    assert on.terms["deepspeed_buffers"] == largest and "deepspeed_buffers" not in off.terms
    assert on.memory["optimizer"] == 0
    # offload's rank is priced by its states and one GPU's step, the other by the replay of its events: the two
    # agree to the rounding of the allocator's blocks
    assert on.memory["peak_allocated"] == pytest.approx(
        off.memory["peak_allocated"] - off.memory["optimizer"] + largest, rel=1e-3)


def test_a_rank_whose_step_holds_less_peaks_at_the_engines_flat_copy(tmp_path):
    """DeepSpeed's ZeRO-1/2 engine copies the trainable parameters into one flat buffer while they still exist
    (`stage_1_and_2.py`): the weights twice, for a moment. With the states offloaded and a short micro-batch the
    step holds less, and that is the rank's peak (measured on an H100: llama-3.2-3b ZeRO-2 offload at world 8 peaked
    in the engine's set-up at 12,256 MiB, twice its 6,127 MiB of weights); under LoRA only the adapters are copied."""
    wide = {**LLAMA, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 8, "vocab_size": 8000}
    (tmp_path / "config.json").write_text(json.dumps(wide))
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    kw = dict(gpus=8, shard="zero2", offload="optimizer", precision="bf16", batch_size=1, seq_len=16, gpu="H100")
    full = estimate(spec, TrainSetup(**kw))
    weights = full.model_states["weights"]
    assert full.peak_phase == "DeepSpeed engine's initialisation"
    flat = 2 * full.model["trainable_parameters"]  # bf16: every parameter, not the rotary buffer
    assert full.memory["peak_allocated"] == full.terms["deepspeed_init_peak"] == weights + flat
    assert any(n.startswith("ZeRO-1/2: the step holds less than the engine's initialisation") for n in full.notes)
    lora = estimate(spec, TrainSetup(**kw, peft="lora"))
    assert lora.peak_phase == "forward/backward" and "deepspeed_init_peak" not in lora.terms


def test_where_the_flat_copy_would_not_fit_beside_the_weights_it_is_made_on_the_host(tmp_path, monkeypatch):
    """DeepSpeed flattens a parameter group on the GPU only where the card's free memory holds the flat buffer
    (`stage_1_and_2.py`, read in 0.19.8), else on the host: on a card one byte short of the weights and the flat copy
    the engine's set-up holds the weights alone, and the rank's peak is its step's; on a card that holds both, the
    set-up is the peak again. Read in DeepSpeed's source, not measured on such a card."""
    import dataclasses

    import trainmem.estimator as estimator

    wide = {**LLAMA, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 8, "vocab_size": 8000}
    (tmp_path / "config.json").write_text(json.dumps(wide))
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    setup = TrainSetup(gpus=8, shard="zero2", offload="optimizer", precision="bf16", batch_size=1, seq_len=16,
                       gpu="H100")
    on_gpu = estimate(spec, setup)
    both = on_gpu.terms["deepspeed_init_peak"]
    for capacity, flattened_on_gpu in ((both - 1, False), (both, True)):
        card = dataclasses.replace(H100, capacity=capacity)
        monkeypatch.setattr(estimator, "find_gpu", lambda name, card=card: card)
        b = estimate(spec, setup)
        assert (b.peak_phase == "DeepSpeed engine's initialisation") is flattened_on_gpu
        assert ("deepspeed_init_peak" in b.terms) is flattened_on_gpu
        assert (b.memory["peak_allocated"] == both) is flattened_on_gpu
        if not flattened_on_gpu:
            assert b.memory["peak_allocated"] < both


def test_deepspeeds_optimizer_step_on_the_fullest_rank():
    """Parameters of 6, 6 and 4 elements over 2 ranks: partitions of 8; rank 0's overlap 12 elements (the first two
    parameters whole), rank 1's 10. bf16: the flatten holds those gradients, a flat partition and its fp32 cast."""
    bf16 = zero.optimizer_step([6, 6, 4], 2, 2, foreach=True)
    assert bf16 == zero.StepPeak(gradients=2 * 12, other=2 * 8 + 4 * 8, moment="flatten", rank=0)
    # six parameters over partitions of 8: rank 1's [8, 16) overlaps 10 elements, rank 0's 9
    fp32 = zero.optimizer_step([3, 3, 3, 3, 3, 1], 2, 4, foreach=True)
    # `.to(fp32)` copies nothing
    assert (fp32.gradients, fp32.other, fp32.moment, fp32.rank) == (4 * 10, 4 * 8, "flatten", 1)
    # the partitions are padded to a multiple of 2 x world: 18 elements over 2 ranks are 20, partitions of 10
    assert zero.optimizer_step([9, 9], 2, 2, foreach=True).gradients == 2 * 18
    # the fullest rank: the one whose parameters reach furthest past its bounds
    assert zero.optimizer_step([3, 3, 3, 3, 3, 1], 2, 2, foreach=True).rank == 1
    assert zero.optimizer_step([], 4, 2, foreach=True) == zero.StepPeak(0, 0, "flatten", 0)


def test_deepspeeds_gradient_norm_copies_the_largest_piece_of_a_partition_to_fp64():
    """`get_grad_norm_direct` copies each gradient piece inside the partition to fp64 in turn: a parameter that
    fills a partition (an embedding) makes the norm the step's peak. Over partitions of 6, rank 0's piece of the
    10-element parameter is 6 elements (48 bytes in fp64) and it overlaps 10 elements; rank 1's largest piece is 4."""
    step = zero.optimizer_step([10, 2], 2, 2, foreach=True)
    assert step == zero.StepPeak(gradients=2 * 10, other=8 * 6, moment="norm", rank=0)
    assert zero.partition_of([10, 2], 2) == (6, [10, 12], [6, 4])
    # a rank asked is priced as itself: rank 1 overlaps 12 elements, its largest piece is 4, so its flatten peaks
    asked = zero.optimizer_step([10, 2], 2, 2, foreach=True, rank=1)
    assert asked == zero.StepPeak(2 * 12, 2 * 6 + 4 * 6, "flatten", 1)
    # many small parameters: the flatten and its fp32 cast hold more than any one piece's fp64 copy
    assert zero.optimizer_step([1] * 16, 2, 2, foreach=True).moment == "flatten"


def test_a_rank_whose_optimizer_step_peaks_says_which_rank_and_what_it_holds():
    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(gpus=8, shard="zero2", precision="bf16", batch_size=1, seq_len=16, gpu="H100")
    b = estimate(spec, setup)
    assert b.peak_phase == "optimizer step"
    trainable = [p.numel for p in inventory(spec, setup.validate(spec), "bf16").params if p.trainable]
    step = zero.optimizer_step(trainable, 8, 2, foreach=True)
    assert b.memory["gradients"] == step.gradients
    # beside the step's copies: the cuBLAS workspace, DeepSpeed's gradient bucket, the rounding of the blocks
    extra = b.memory["other"] - step.other - b.terms["cublas_workspace"]
    assert 2 * spec.hf_config().hidden_size ** 2 <= extra <= 2 * spec.hf_config().hidden_size ** 2 + 64 * 1024
    assert any(n.startswith(f"ZeRO-1/2 optimizer step: rank {step.rank}, the fullest") for n in b.notes)


def test_the_deepspeed_config_enables_its_own_autocast_for_amp_only():
    """DeepSpeed's engine turns the loop's autocast off inside its forward unless its config enables one."""
    from trainmem.measure.deepspeed import ds_config

    setup = TrainSetup(gpus=2, shard="zero2")
    assert ds_config(setup, "amp-bf16", 64)["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    assert "torch_autocast" not in ds_config(setup, "bf16", 64) and "torch_autocast" not in ds_config(setup, "fp32", 64)


def test_the_terminal_says_a_ranks_estimate_is_for_one_gpu_of_n_on_the_card_asked():
    from rich.console import Console

    from trainmem.output.render import result_tables

    r = estimate(ModelSpec.resolve("tiny-llama"), TrainSetup(gpus=4, shard="zero2", precision="bf16", batch_size=2,
                                                              seq_len=32, gpu="A10G"), "analytic")
    console = Console(record=True, width=160)
    for part in result_tables(r.to_result("A10G")):
        console.print(part)
    text = console.export_text()
    assert "for one GPU of 4 (zero2)" in text and "on A10G" in text and "on cuda" not in text
    assert "gradients 0.00 MiB" in text.split("after an optimizer step")[1]


def _rank_replay(found: zero.Excess, spec: ModelSpec, setup: TrainSetup, rank: int = 0) -> tuple[list, Any]:
    from trainmem.estimator.memory import allocator

    trainable = [p for p in inventory(spec, setup, "bf16").params if p.trainable]
    made = zero.rank_events(found, setup.shard, [p.numel for p in trainable], 2, setup.gpus, rank,
                            spec.hf_config().hidden_size ** 2, True)
    a = allocator.CachingAllocator()
    assert allocator.replay_steps(made.events, made.steady, a)  # the rank's last step repeats on its own keys
    return made.events, a


def _rank_reserved(found: zero.Excess, spec: ModelSpec, setup: TrainSetup, rank: int = 0) -> tuple[list, int]:
    events, a = _rank_replay(found, spec, setup, rank)
    return events, a.peak_reserved


def _rank_allocated(spec: ModelSpec, setup: TrainSetup) -> int:
    """The peak allocated bytes of the replay of the fullest rank's events, the one the estimate prices."""
    setup = setup.validate(spec)
    sizes = [p.numel for p in inventory(spec, setup, "bf16").params if p.trainable]
    rank = zero.optimizer_step(sizes, setup.gpus, 2, foreach=True).rank
    found = simulated_step(spec, setup, "bf16", H100)
    return _rank_replay(found, spec, setup, rank)[1].peak_allocated


@pytest.mark.parametrize("shard", ["zero1", "zero2"])
def test_a_zero_ranks_reserved_is_the_replay_of_its_own_events(shard):
    """The rank's events are one GPU's with DeepSpeed's engine in place: the trainable weights copied into one flat
    buffer and freed, the fp32 partition, and no gradient of one GPU's left after a backward (ZeRO-2: none made)."""
    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(gpus=4, shard=shard, precision="bf16", batch_size=2, seq_len=64, gpu="H100").validate(spec)
    found = simulated_step(spec, setup, "bf16", H100)
    events, reserved = _rank_reserved(found, spec, setup, rank=1)
    first = found.marks["step1.micro1.forward"]
    assert events[:first] == found.events[:first]  # the build as one GPU's
    trainable = 2 * spec.parameter_count
    assert events[first][1] >= trainable  # the flat buffer, padded to 2 x world elements
    freed = {k for k, n in events[first + 1:] if n == -1}
    built = {k for k, n in events[:first] if n > 0}
    assert sum(n for k, n in events[:first] if k in freed & built) >= trainable - 2 * 64  # the weights it replaces
    b = estimate(spec, setup.replace(engine="deepspeed", rank=1))
    assert b.terms["replayed_reserved"] == reserved
    assert b.memory["peak_reserved"] == max(reserved, b.memory["peak_allocated"])
    assert any(n.startswith("ZeRO-1/2: peak allocated and reserved from the allocator replay") for n in b.notes)


def test_a_deep_ranks_events_compose_to_its_whole_models(tmp_path):
    """The rank's events from the composed single-GPU step replay to the same reserved bytes as from the whole
    model's simulated step."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    setup = TrainSetup(gpus=2, shard="zero2", precision="bf16", batch_size=2, seq_len=64, checkpointing=True,
                       gpu="H100").validate(spec)
    composed = simulated_step(spec, setup, "bf16", H100)
    single = zero.single_gpu(setup)
    ledger = simulate_step(model_builder(spec, single, "bf16", H100), single, "bf16", workspace=H100.cublas_workspace,
                           flash=H100.flash, sms=H100.sms, splits=True)[0]
    whole = zero.excess(ledger)
    whole = type(whole)(whole.bytes, whole.activations, whole.gradients, events=ledger.events, marks=ledger.marks)
    assert composed.events is not None and len(composed.events) == len(ledger.events)
    assert _rank_reserved(composed, spec, setup)[1] == _rank_reserved(whole, spec, setup)[1]


def test_optimizer_offload_keeps_the_reserved_ratio_and_says_so():
    spec = ModelSpec.resolve("tiny-llama")
    b = estimate(spec, TrainSetup(gpus=2, shard="zero2", offload="optimizer", precision="bf16", gpu="H100"))
    assert "replayed_reserved" not in b.terms
    assert any(n.startswith("ZeRO-1/2 reserved: the allocated bytes times") for n in b.notes)


def test_the_partition_buffer_comes_with_the_first_reduced_bucket_that_reaches_the_partition():
    """DeepSpeed's contiguous reduction (`zero._Reduction`): each gradient is freed as it is copied into the bucket;
    a full bucket is reduced, and the first that holds a parameter of the rank's partition makes its buffer; a
    gradient larger than the bucket keeps its own block until its reduction."""
    out: list = []
    made: list[int] = []
    walk = zero._Reduction(10, 20, 40, lambda: made.append(len(out)) or "held", out)
    for i, start in enumerate(range(0, 60, 5)):  # twelve gradients of 5 elements, in the flat order
        walk.arrive(f"g{i}", 5, start)
    # buckets of two gradients; the one holding elements 20-29 is reduced when g6 arrives
    assert made == [6] and walk.held == "held"
    assert out == [(f"g{i}", -1) for i in range(12)]
    walk.arrive("large", 15, 60)
    assert out[-1] == ("g11", -1)  # it waits for its reduction
    walk.reduce()
    assert out[-1] == ("large", -1) and made == [6]


@pytest.mark.parametrize("shard", ["zero1", "zero2"])
def test_a_zero1_rank_keeps_its_gradients_larger_than_the_bucket_until_its_partition_buffer_exists(shard):
    """A gradient larger than the bucket is reduced on its own (`extra_large_param_to_reduce`); a ZeRO-2 rank frees
    it there, a ZeRO-1 rank keeps it until the reduction reaches its partition, as the allocator traces of ZeRO-1
    ranks show (phi-3-mini at world 4, rank 3: its gradients larger than the bucket are freed only after
    `copy_grads_in_partition` makes the partition buffer, which is the rank's peak)."""
    out: list = []
    walk = zero._Reduction(10, 20, 40, lambda: out.append(("held", 1)) or "held", out, keep_large=shard == "zero1")
    walk.arrive("large", 15, 0)  # elements 0-14, outside the partition [20, 40)
    walk.arrive("small", 5, 15)  # the large gradient's bucket is reduced first
    walk.arrive("inside", 5, 20)
    walk.finish()
    if shard == "zero2":
        assert out == [("large", -1), ("small", -1), ("inside", -1), ("held", 1)]
    else:
        assert out == [("small", -1), ("inside", -1), ("held", 1), ("large", -1)]


def test_a_zero1_rank_replays_to_the_peak_of_its_partition_buffer_beside_its_large_gradients(tmp_path, monkeypatch):
    """On a model whose matrices are larger than DeepSpeed's bucket (h x h elements), the last rank of a ZeRO-1 run
    allocates its partition buffer while the gradients larger than the bucket are still held: its peak is higher
    than if the reduction had freed them, by at most their bytes."""
    wide = {**LLAMA, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 4, "vocab_size": 4096}
    (tmp_path / "config.json").write_text(json.dumps(wide))
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    # fp32: the step's cast copies nothing, so the step holds less than the reduction
    setup = TrainSetup(gpus=2, shard="zero1", precision="fp32", batch_size=1, seq_len=16, rank=1, engine="deepspeed",
                       gpu="H100")
    kept = estimate(spec, setup)
    sizes = [p.numel for p in inventory(spec, setup.validate(spec), "fp32").params if p.trainable]
    large = 4 * sum(n for n in sizes if n > 128 * 128)

    class Freeing(zero._Reduction):  # the reduction as a ZeRO-2 rank's: each large gradient freed at its own
        def __init__(self, *args, keep_large=False, **kwargs):
            super().__init__(*args, keep_large=False, **kwargs)

    monkeypatch.setattr(zero, "_Reduction", Freeing)
    freed = estimate(spec, setup)
    assert 0 < kept.memory["peak_allocated"] - freed.memory["peak_allocated"] <= large
