"""`--attention flash_attention_2|flash_attention_3`: flash-attn's kernels, priced from its sources (derived, not
measured: the package is not installed here). The flag's problems, and the estimate's activations against SDPA's
by the figures the stand-in's docstring derives, computed here from the shapes."""

from __future__ import annotations

import dataclasses

import pytest

import trainmem
from trainmem import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.measure.build import environment_problems, has_flash_attn


def test_a_mistyped_value_gets_a_suggestion() -> None:
    (line,) = TrainSetup(attention="flash_attention2").problems()
    assert line.startswith("--attention: 'flash_attention2' is not one of")
    assert line.endswith("did you mean flash_attention_2?")


@pytest.mark.parametrize("attention, gpu, refused", [
    ("flash_attention_3", "A100-80GB", "FlashAttention-3 runs on Hopper only"),
    ("flash_attention_3", "H100", None),
    ("flash_attention_2", "T4", "FlashAttention-2 needs compute capability 8.0"),
    ("flash_attention_2", "V100-32GB", "FlashAttention-2 needs compute capability 8.0"),
    ("flash_attention_2", "A100-40GB", None),
])
def test_the_card_rule(attention: str, gpu: str, refused: str | None) -> None:
    problems = TrainSetup(attention=attention, gpu=gpu, precision="fp16").problems()
    if refused is None:
        assert problems == []
    else:
        (line,) = problems
        assert line.startswith(f"--attention {attention}: {refused}") and f"--gpu {gpu}" in line


def test_fp32_without_autocast_is_refused_and_autocast_is_not() -> None:
    (line,) = TrainSetup(attention="flash_attention_2", precision="fp32").problems()
    assert line.startswith("--attention flash_attention_2:") and "--precision bf16" in line
    assert TrainSetup(attention="flash_attention_2", precision="amp-bf16").problems() == []
    spec = ModelSpec.resolve("tiny-llama")  # stored fp32: auto keeps it
    (line,) = TrainSetup(attention="flash_attention_2").problems(spec)
    assert "checkpoint is fp32" in line and "--precision bf16" in line


def test_run_without_the_package_is_one_line() -> None:
    if has_flash_attn("flash_attention_2"):
        pytest.skip("flash-attn is installed here")
    setup = TrainSetup(attention="flash_attention_2", precision="bf16")
    (line,) = [p for p in environment_problems(setup, "cuda", "bf16") if p.startswith("--attention")]
    assert "needs the flash-attn package" in line and "trainmem estimate" in line


B, S, H, HK, LAYERS = 2, 256, 4, 2, 2


def _spec(head_dim: int) -> ModelSpec:
    spec = ModelSpec.resolve("tiny-llama")  # 4 heads, 2 KV heads, 2 layers
    return dataclasses.replace(spec, name=f"tiny-llama-d{head_dim}",
                               config={**spec.config, "hidden_size": H * head_dim, "head_dim": head_dim})


def _activations(spec: ModelSpec, attention: str) -> int:
    setup = TrainSetup(attention=attention, precision="bf16", batch_size=B, seq_len=S)
    return trainmem.estimate(spec, setup).memory["activations"]


def test_fa2_saves_padded_inputs_and_its_rng_state() -> None:
    # head size 12: FA2 pads q, k, v to 16 and saves them and its padded output; the model's o_proj then keeps a
    # copy of the cropped output (its reshape of a strided view copies), where SDPA's output was o_proj's input;
    # and each layer saves a 2 x int64 rng_state
    d, padded = 12, 16
    spec = _spec(d)
    half = 2
    per_layer = half * B * S * ((H + HK + HK + H) * (padded - d) + H * d) + 16
    assert _activations(spec, "flash_attention_2") - _activations(spec, "sdpa") == LAYERS * per_layer


def test_fa2_without_padding_differs_by_the_rng_state_only() -> None:
    spec = _spec(16)
    assert _activations(spec, "flash_attention_2") - _activations(spec, "sdpa") == LAYERS * 16


def test_fa3_estimates_on_an_h100_and_is_refused_on_an_a100() -> None:
    spec = _spec(16)
    setup = TrainSetup(attention="flash_attention_3", precision="bf16", batch_size=B, seq_len=S)
    b = trainmem.estimate(spec, setup.replace(gpu="H100"))
    assert b.memory["activations"] == _activations(spec, "sdpa")  # q, k, v, out, lse: SDPA flash's saves
    assert any("flash_attention_3" in n and "derived" in n for n in b.notes)
    with pytest.raises(SetupError) as e:
        trainmem.estimate(spec, setup.replace(gpu="A100-80GB"))
    assert len(str(e.value).splitlines()) == 1 and "--attention flash_attention_3" in str(e.value)
