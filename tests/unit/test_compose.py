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


def test_several_setups_cut_at_once_are_each_setups_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cut_steps` (the checked advice's changes: every cut model of every setup one piece of one pool) gives each
    setup the step `simulated_step` composes for it alone; a setup simulated whole (QLoRA) or refused is None."""
    from trainmem.estimator import cut_steps

    spec = ModelSpec.resolve("tiny-llama").cut(9)
    base = dict(precision="bf16", batch_size=2, seq_len=64, gpu="H100")
    setups = [TrainSetup(**base, gpus=4, shard="fsdp"), TrainSetup(**base, peft="lora"),
              TrainSetup(**base, peft="qlora")]
    monkeypatch.setattr(compose, "MIN_LAYERS", 9)
    steps = cut_steps(spec, setups)
    assert steps[2] is None
    for setup, step in zip(setups[:2], steps):  # an FSDP rank cut from 4 layers up, the others from 3
        own = _step(spec, setup.validate(spec), monkeypatch, 9)
        assert isinstance(step, compose.ComposedStep)
        assert (step.events, step.marks, step.peak, step.peak_split) == (own.events, own.marks, own.peak,
                                                                         own.peak_split)


def test_a_cut_the_meta_device_cannot_run_is_left_to_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut model whose step reads a value the meta device cannot know leaves its setup to `estimate`, which falls
    back to the analytic method as it does for any model (the advice then estimates it whole, as before)."""
    import trainmem.estimator as estimator
    from trainmem.estimator.memory.hostvalues import UnknownValue

    def unknown(*args, **kwargs):
        raise UnknownValue("a value that depends on the data")

    monkeypatch.setattr(compose, "MIN_LAYERS", 9)
    monkeypatch.setattr(estimator, "_simulated", unknown)
    spec = ModelSpec.resolve("tiny-llama").cut(9)
    assert estimator.cut_steps(spec, [TrainSetup(batch_size=2, seq_len=64, gpu="H100")]) == [None]
