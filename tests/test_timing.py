"""The step-time model: exact FLOP counts on a tiny model, the monotonic cases on real presets, the card
figures, and the `time` field of every estimate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate, states, timing
from trainmem.gpus import CATALOG, SPEEDS


def _work(model: str, setup: TrainSetup, card: str = "H200") -> timing.Workload:
    spec = ModelSpec.resolve(model)
    setup = setup.validate(spec)
    precision = setup.resolved_precision(spec, "cuda")
    return timing.workload(states.inventory(spec, setup, precision), setup, precision, CATALOG[card])


def _step(model: str, card: str = "H200", **kw) -> float:
    return timing.step_time(_work(model, TrainSetup(**kw), card), CATALOG[card]).step_s


def test_forward_flops_are_two_per_matmul_weight_per_token():
    """tiny-llama (untied head): 2 layers x (q 64x64, k 32x64, v 32x64, o 64x64, gate/up 176x64, down 64x176)
    + the 1024 x 64 head; embeddings are lookups. Attention: 4 s x width per token and layer, halved (causal)."""
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


def test_logits_lora_and_4bit_casts_are_counted_per_token_and_feature():
    """tiny-llama, 64 tokens: the loss's traffic is `LOGITS_BYTES` per logit (vocabulary 1024); LoRA's default
    targets q (64 -> 64) and v (64 -> 32) of both layers move 7 activation elements per in and out feature over forward and
    backward, + a 1-byte dropout mask written and read; QLoRA's 4-bit Linears (every layer Linear, not the
    head) cast input and output, 6 bytes per feature per pass (forward, backward)."""
    tokens = 64
    full = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16"))
    assert full.micro_bytes["logits"] == tokens * 1024 * timing.LOGITS_BYTES
    assert full.micro_bytes["lora"] == 0 and full.micro_bytes["quant_casts"] == 0
    lora = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16", peft="lora"))
    layers = 2
    assert lora.micro_bytes["lora"] == tokens * layers * (2 * 7 * (2 * 64 + 64 + 32) + 2 * 2 * 64)
    qlora = _work("tiny-llama", TrainSetup(batch_size=2, seq_len=32, precision="bf16", peft="qlora"))
    per_layer = (64 + 64) + 2 * (32 + 64) + (64 + 64) + 3 * (176 + 64)
    assert qlora.micro_bytes["quant_casts"] == tokens * 2 * per_layer * timing.QLORA_CAST_BYTES * 2


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
