"""The step-time model: exact FLOP counts on a tiny model, the monotonic cases on real presets, the card
figures, and the `time` field of every estimate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate
from trainmem.estimator.memory import states
from trainmem.estimator.time import kernels
from trainmem.estimator.time import step as timing
from trainmem.hardware.gpus import CATALOG, SPEEDS


def _work(model: str, setup: TrainSetup, card: str = "H200") -> timing.Workload:
    spec = ModelSpec.resolve(model)
    setup = setup.validate(spec)
    precision = setup.resolved_precision(spec, "cuda")
    return timing.workload(spec, states.inventory(spec, setup, precision), setup, precision, CATALOG[card])


def _step(model: str, card: str = "H200", **kw) -> float:
    return timing.step_time(_work(model, TrainSetup(**kw), card), CATALOG[card]).step_s


def test_forward_flops_are_two_per_matmul_weight_per_token():
    """tiny-llama (untied head): 2 layers x (q 64x64, k 32x64, v 32x64, o 64x64, gate/up 176x64, down 64x176)
    + the 1024 x 64 head; embeddings are lookups. Attention: 4 s x width per token and layer, halved (causal
    flash)."""
    per_layer = 64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 3 * 176 * 64
    matmul = 2 * per_layer + 1024 * 64
    w = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16"))
    assert w.flops["forward"] == 2 * matmul * 64
    assert w.flops["backward"] == 2 * w.flops["forward"]  # every weight trains: input and weight gradients
    assert w.flops["recompute"] == 0
    assert w.flops["attention"] == 4 * 32 * 64 * 2 * 64 * 0.5 * 3  # forward + backward (2x)


def test_frozen_weights_need_no_weight_gradients_and_checkpointing_recomputes_the_layers():
    full = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16"))
    lora = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16", peft="lora"))
    ckpt = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16", checkpointing=True))
    adapters = lora.flops["forward"] - full.flops["forward"]  # LoRA's own matmuls
    assert 0 < adapters < 0.05 * full.flops["forward"]
    assert lora.flops["backward"] == pytest.approx(full.flops["forward"] + 2 * adapters)
    head = 2 * 1024 * 64 * 64
    assert ckpt.flops["recompute"] == full.flops["forward"] - head


@pytest.mark.parametrize("model,kw", [
    ("gemma-3-1b", dict(precision="bf16")),  # 26 layers of two types (`layer_types` cut with them)
    ("qwen2.5-0.5b", dict(precision="amp-bf16", peft="lora", checkpointing=True)),
    ("llama-3.2-1b", dict(precision="bf16", peft="qlora")),
    ("gpt2", dict(precision="fp32")),
    ("gpt2", dict(precision="amp-bf16", peft="lora")),  # the unaligned head (50257 tokens) under LoRA
])
def test_kernel_counts_extrapolated_from_one_and_two_layers_match_the_whole_model(model, kw):
    """`kernels.count` traces the model cut to one and two layers at micro-batch 1 and 2 and extrapolates; a
    trace of the whole model at micro-batch 3 gives the same launches (within 2%: a few operators differ
    between a model's first layer and the others) and bytes (within 1%)."""
    spec = ModelSpec.resolve(model)
    setup = TrainSetup(batch_size=3, seq_len=32, **kw).validate(spec).resolved(spec)
    precision = setup.resolved_precision(spec, "cuda")
    counted = kernels.count(spec, setup, precision, CATALOG["H200"])
    whole = kernels._trace(spec, setup, precision, CATALOG["H200"])
    assert counted.launches == pytest.approx(whole.launches, rel=0.02)
    assert counted.bytes(3) == pytest.approx(whole.bytes, rel=0.01)
    # (abs: the rotary embedding's s x 1 @ 1 x s outer product, 2 s^2 FLOPs whatever the batch, is not extrapolated)
    assert counted.unaligned(3) == pytest.approx(whole.unaligned, rel=0.01, abs=1e6)
    assert counted.attention(3) == pytest.approx(whole.attention, rel=1e-9)


def _attention(model: str, seq_len: int, **kw: object) -> dict[str, float]:
    """Attention's FLOPs per sequence by kernel, in units of one layer's forward scores and values unmasked
    (4 s^2 x width), summed over the layers."""
    spec = ModelSpec.resolve(model)
    cfg = spec.hf_config()
    width = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    setup = TrainSetup(batch_size=1, seq_len=seq_len, **kw)
    counted = kernels.count(spec, setup, setup.precision, CATALOG["H200"])
    return {k: v / (4 * seq_len**2 * width) for k, v in counted.attention(1).items()}


def test_attention_is_counted_per_call_with_the_kernel_cuda_picks():
    """Flash skips a causal product's masked half (forward 0.5, backward 1.0 per layer); a checkpointed layer
    runs its forward twice; the math path (eager attention; grouped heads in fp32) computes the whole product."""
    assert _attention("tiny-llama", 32, precision="bf16") == {"flash-half": 2 * 1.5}
    assert _attention("tiny-llama", 32, precision="bf16", checkpointing=True) == {"flash-half": 2 * 2.0}
    assert _attention("tiny-llama", 32, precision="bf16", attention="eager") == {"math-half": 2 * 3.0}
    assert _attention("tiny-llama", 32, precision="fp32") == {"math-fp32": 2 * 3.0}  # 2 KV heads for 4


def test_a_sliding_window_runs_the_memory_efficient_kernel_over_the_whole_product():
    """Gemma-3's sliding layers (window 512; 22 of its 26 layers) get an explicit mask beyond 512 tokens:
    flash takes none, so CUDA runs the memory-efficient kernel, which skips no block. Its full-attention layers
    stay on flash. At 256 tokens transformers leaves the mask out and every layer runs flash."""
    types = ModelSpec.resolve("gemma-3-1b").hf_config().layer_types
    sliding, full = types.count("sliding_attention"), types.count("full_attention")
    assert (sliding, full) == (22, 4)
    assert _attention("gemma-3-1b", 1024, precision="bf16") == pytest.approx(
        {"efficient-half": 3.0 * sliding, "flash-half": 1.5 * full})
    assert _attention("gemma-3-1b", 256, precision="bf16") == pytest.approx({"flash-half": 1.5 * 26})
    # extrapolated by layer type, as a trace of the whole model counts it
    spec = ModelSpec.resolve("gemma-3-1b")
    setup = TrainSetup(batch_size=1, seq_len=1024, precision="bf16").resolved(spec)
    whole = kernels._trace(spec, setup, "bf16", CATALOG["H200"]).attention
    assert kernels.count(spec, setup, "bf16", CATALOG["H200"]).attention(1) == pytest.approx(whole, rel=1e-9)


def test_checkpointing_launches_the_layers_forward_again():
    spec = ModelSpec.resolve("tiny-llama")
    plain, ckpt = (kernels.count(spec, TrainSetup(batch_size=2, seq_len=32, precision="bf16", checkpointing=c),
                                 "bf16", CATALOG["H200"]) for c in (False, True))
    assert ckpt.launches > plain.launches and ckpt.bytes(2) > plain.bytes(2)


def test_autocast_casts_move_bytes_but_are_not_host_launches(monkeypatch):
    """CUDA autocast casts in the dispatcher, not in Python: `kernels._Casts` keeps them out of the launches."""
    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(batch_size=2, seq_len=32, precision="amp-bf16")
    without = kernels._trace(spec, setup, "amp-bf16", CATALOG["H200"])[0]
    monkeypatch.setattr(kernels._Casts, "__enter__", lambda self: None)
    with_casts = kernels._trace(spec, setup, "amp-bf16", CATALOG["H200"])[0]
    assert with_casts > without


@pytest.mark.parametrize("precision,peft,passes", [("bf16", "none", 3), ("amp-fp16", "lora", 2), ("fp32", "none", 0)])
def test_half_precision_products_over_gpt2s_vocabulary_are_the_unaligned_ones(precision, peft, passes):
    """GPT-2's head is 50257 x 768, its only dimension that is not a multiple of 8: the unaligned FLOPs are its
    forward, its input gradient and (where it trains, tied to the embedding) its weight gradient, exactly,
    and only in half precision (fp32 runs on CUDA cores, where alignment matters little)."""
    spec = ModelSpec.resolve("gpt2")
    setup = TrainSetup(batch_size=2, seq_len=32, precision=precision, peft=peft).validate(spec).resolved(spec)
    counted = kernels.count(spec, setup, precision, CATALOG["H200"])
    assert counted.unaligned(2) == passes * 2 * 50257 * 768 * 64
    assert kernels.count(ModelSpec.resolve("qwen2.5-0.5b"), setup, precision, CATALOG["H200"]).unaligned(2) == 0


def test_a_vocabulary_padded_to_a_multiple_of_8_is_faster():
    """What nanoGPT's 50304 and `resize_token_embeddings(pad_to_multiple_of=8)` are for: seven more tokens of
    head FLOPs cost less than the unaligned products of 50257 (`timing.UNALIGNED_SLOWDOWN`)."""
    import dataclasses

    spec = ModelSpec.resolve("gpt2")
    padded = dataclasses.replace(spec, name="gpt2 [vocab 50264]", config={**spec.config, "vocab_size": 50264})
    setup = TrainSetup(batch_size=16, seq_len=1024, precision="bf16")

    def step(s: ModelSpec) -> float:
        v = setup.validate(s)
        w = timing.workload(s, states.inventory(s, v, "bf16"), v, "bf16", CATALOG["H200"])
        return timing.step_time(w, CATALOG["H200"]).step_s

    assert step(padded) < step(spec)


def test_the_8bit_optimizer_is_slower_than_foreach_adamw_on_an_8b_model():
    """bitsandbytes' 8-bit AdamW moves fewer bytes than foreach AdamW but runs far below the bandwidth
    (`EFF_8BIT`): on llama-3.1-8b full fine-tuning (measured: 485 ms at b2 s512 with checkpointing) it costs
    more per step, and its bytes are 3 x the weight's + 4 per parameter."""
    kw = dict(batch_size=2, seq_len=512, precision="bf16", checkpointing=True)
    w = _work("llama-3.1-8b", TrainSetup(optimizer="adamw-8bit", **kw))
    trained = sum(p.numel for p in states.inventory(ModelSpec.resolve("llama-3.1-8b"), TrainSetup(**kw), "bf16").params
                  if p.trainable)
    assert w.step_bytes["optimizer"] == 0 and w.step_bytes_8bit == pytest.approx(10 * trained)
    assert _step("llama-3.1-8b", optimizer="adamw-8bit", **kw) > _step("llama-3.1-8b", **kw)


@pytest.mark.parametrize("card", ["T4", "A10G", "H100-80GB", "H200"])
@pytest.mark.parametrize("peft", ["none", "lora", "qlora"])
def test_checkpointing_is_never_faster(card, peft):
    precision = "fp16" if card == "T4" else "bf16"
    for b in (1, 4, 16):
        plain = _step("qwen2.5-0.5b", card, batch_size=b, peft=peft, precision=precision)
        assert _step("qwen2.5-0.5b", card, batch_size=b, peft=peft, precision=precision, checkpointing=True) > plain


@pytest.mark.parametrize("card", ["H100-80GB", "H200"])
@pytest.mark.parametrize("model", ["polyglot-ko-1.3b", "llama-3.2-1b"])
def test_more_micro_steps_for_the_same_tokens_are_not_faster_on_a_big_card(card, model):
    times = [_step(model, card, batch_size=b, grad_accum=32 // b, precision="fp16") for b in (1, 2, 4, 8, 16, 32)]
    assert all(later <= earlier for earlier, later in zip(times, times[1:])), times


def test_lora_is_faster_than_full_fine_tuning_where_compute_bounds():
    assert _step("llama-3.2-1b", "A10G", batch_size=16, peft="lora") < _step("llama-3.2-1b", "A10G", batch_size=16)


def test_a_faster_card_is_faster():
    kw = dict(batch_size=8, precision="fp16")
    assert _step("polyglot-ko-1.3b", "H200", **kw) < _step("polyglot-ko-1.3b", "A10G", **kw) < _step(
        "polyglot-ko-1.3b", "T4", **kw)


def test_every_card_has_speed_figures_with_a_source():
    assert set(SPEEDS) == set(CATALOG)
    for name, s in SPEEDS.items():
        assert s.half_tflops > s.fp32_tflops > 0 and s.bandwidth_gbs > 0 and "NVIDIA" in s.source, name


def test_estimate_carries_the_time_and_says_where_it_is_derived():
    t4 = estimate("tiny-llama", TrainSetup(batch_size=2, seq_len=32, gpu="T4", precision="fp16"), "analytic")
    assert t4.time["card"] == "T4" and t4.time["derived"] is True
    assert t4.time["step_s"] > 0 and t4.time["tokens_per_s"] == pytest.approx(64 / t4.time["step_s"])
    assert 0 < t4.time["mfu"] < 1
    assert any("time: derived from the T4" in n for n in t4.notes)
    h200 = estimate("tiny-llama", TrainSetup(batch_size=2, seq_len=32), "analytic")
    assert h200.time["card"] == "H200" and h200.time["derived"] is False
    assert json.loads(t4.to_result("T4").to_json())["time"]["step_s"] == t4.time["step_s"]


def test_estimate_json_and_terminal_show_the_time():
    cli = [sys.executable, "-m", "trainmem.cli", "estimate", "--model", "tiny-llama", "--batch-size", "2",
           "--seq-len", "32", "--gpu", "A10G", "--method", "analytic"]
    row = json.loads(subprocess.run(cli + ["--json"], capture_output=True, text=True, check=True).stdout)
    assert set(row["time"]) >= {"step_s", "tokens_per_s", "mfu"} and row["time"]["card"] == "A10G"
    text = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert "predicted time on the A10G" in text and "tokens/s" in text


def test_measured_rows_are_predicted_at_the_card_they_ran_on():
    """time_validate predicts a row at its own card's figures: held-out 14 ran on an H100, every earlier set on
    the H200; a row from any other device is not a timing row."""
    from lab import timing as time_validate

    setup = TrainSetup(batch_size=8, seq_len=1024, precision="bf16")
    row = {"model": {"name": "qwen2.5-0.5b"}, "setup": setup.to_dict()}
    h100 = {**row, "env": {"gpu": "NVIDIA H100 80GB HBM3"}}
    h200 = {**row, "env": {"gpu": "NVIDIA H200"}}
    assert time_validate.ran_on(h100) == "H100-80GB" and time_validate.ran_on(h200) == "H200"
    assert time_validate.ran_on({**row, "env": {"gpu": "NVIDIA A100-SXM4-80GB"}}) is None
    work = time_validate.row_work(h100)[0]
    assert time_validate.predict(h100) == timing.step_time(work, CATALOG["H100-80GB"]).step_s
    assert time_validate.predict(h100) > time_validate.predict(h200)  # the same work at the H100's lower figures


@pytest.mark.slow  # two minutes of CPU matrix products: lab tooling, not a contributor's pre-commit check
def test_the_alignment_benchmark_runs_and_compares_with_the_padded_vocabulary():
    """benchmarks/matmul_alignment.py, which measured `UNALIGNED_SLOWDOWN` on the H200, on tiny CPU products."""
    from lab import alignment as matmul_alignment

    rows = matmul_alignment.measure("cpu", tokens=16, repeat=1)
    assert len(rows) == 2 * 3 * 3  # dtypes x vocabularies x products
    assert all(r["slowdown_per_flop"] == 1 for r in rows if r["vocab"] == 50264)
    assert all(r["seconds"] > 0 and r["tflops"] > 0 for r in rows)


def test_the_estimate_says_what_padding_an_unaligned_vocabulary_would_save():
    note = "pad_to_multiple_of=8"
    half = estimate("gpt2", TrainSetup(batch_size=16, seq_len=1024, precision="bf16"), "analytic")
    assert any(note in n and "50257" in n for n in half.notes)
    fp32 = estimate("gpt2", TrainSetup(batch_size=16, seq_len=1024, precision="fp32"), "analytic")
    aligned = estimate("qwen2.5-0.5b", TrainSetup(batch_size=16, seq_len=1024, precision="bf16"), "analytic")
    assert not any(note in n for n in fp32.notes + aligned.notes)


def test_qlora_layers_bitsandbytes_leaves_alone_multiply_in_fp32(tmp_path):
    """Falcon's FalconLinear is not quantized and peft casts it to fp32, so under QLoRA its products run at the
    fp32 rate (held-out 16: Falcon-7b QLoRA 1.49 s measured, 0.34 s when priced at the half rate); a Llama's
    4-bit Linears keep the half rate."""
    from lab import registry

    registry.tiny_config("falcon").save_pretrained(tmp_path)
    falcon = str(tmp_path / "config.json")
    kw = dict(batch_size=2, seq_len=32, precision="bf16")
    qlora, lora = _work(falcon, TrainSetup(peft="qlora", **kw)), _work(falcon, TrainSetup(peft="lora", **kw))
    moved = lora.flops["forward"] - qlora.flops["forward"]  # the frozen blocks' products leave the half count
    assert moved > 0 and qlora.flops["fp32"] == 2 * moved  # forward and the input gradient, at the fp32 rate
    assert _work("tiny-llama", TrainSetup(peft="qlora", **kw)).flops["fp32"] == 0
    big = dict(batch_size=2, seq_len=1024, precision="bf16")  # compute-bound, where the rate shows
    assert _step("falcon-7b", peft="qlora", **big) > 2 * _step("falcon-7b", peft="lora", **big)
