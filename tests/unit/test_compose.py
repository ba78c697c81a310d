"""A deep model's step composed from cut models equals the step simulated whole, event for event."""

from __future__ import annotations

import pytest

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.estimator import simulated_step
from trainmem.estimator.memory import compose
from trainmem.hardware.gpus import find_gpu

SETUPS = {
    "lora": ("tiny-llama", dict(peft="lora", batch_size=2, seq_len=64)),
    "full amp-bf16, checkpointing, accumulation": ("tiny-llama", dict(precision="amp-bf16", checkpointing=True,
                                                                      grad_accum=2, batch_size=2, seq_len=64)),
    "mixture of experts": ("tiny-qwen3-moe", dict(peft="lora", batch_size=2, seq_len=64)),
    "fsdp rank": ("tiny-llama", dict(gpus=4, shard="fsdp", precision="bf16", batch_size=2, seq_len=64)),
}


def _step(spec: ModelSpec, setup: TrainSetup, monkeypatch: pytest.MonkeyPatch, layers: int) -> object:
    monkeypatch.setattr(compose, "MIN_LAYERS", layers)
    return simulated_step(spec, setup, setup.resolved_precision(spec, "cuda"), find_gpu("H100"))


@pytest.mark.parametrize("case", list(SETUPS))
def test_the_composed_step_is_the_whole_step(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, fields = SETUPS[case]
    spec = ModelSpec.resolve(name).cut(9)
    setup = TrainSetup(**fields).resolved(spec)
    composed = _step(spec, setup, monkeypatch, 0)
    whole = _step(spec, setup, monkeypatch, 10**6)
    assert isinstance(composed, compose.ComposedStep) and not isinstance(whole, compose.ComposedStep)
    a, b = (compose.Trace.of(s.events, s.marks) for s in (composed, whole))
    assert (a.sig, a.ref, a.marks) == (b.sig, b.ref, b.marks)
    assert (composed.peak, composed.peak_split, composed.peak_phase) == (whole.peak, whole.peak_split, whole.peak_phase)


def test_layers_that_differ_are_simulated_whole() -> None:
    config = dict(model_type="llama", num_hidden_layers=30)
    assert compose.uniform("llama", config)
    assert not compose.uniform("gemma3_text", config)
    assert not compose.uniform("llama", {**config, "layer_types": ["sliding_attention", "full_attention"] * 15})
    assert not compose.uniform("qwen3_moe", {**config, "mlp_only_layers": [0]})
    assert compose.uniform("qwen3_moe", {**config, "mlp_only_layers": []})
    assert not compose.uniform("qwen3_moe", {**config, "decoder_sparse_step": 2})


def test_steps_that_are_not_one_block_more_do_not_compose() -> None:
    small = [("A", 8), ("A", 16), ("F", 8)]
    with pytest.raises(compose.ComposeError):
        compose.insertions(small, [("A", 8), ("A", 32), ("A", 16), ("F", 8)])
    assert compose.insertions(small, [("A", 8), ("A", 8), ("A", 16), ("F", 8)]) == [(1, 1)]
