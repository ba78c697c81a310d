"""A simulated step resized to another card's cuBLAS workspace (`estimator.memory.workspace`) is that card's
simulated step: the same events but the two workspaces, the same peak event, `other` changed by the difference."""

from __future__ import annotations

import pytest

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import simulated_step
from trainmem.estimator.memory.compose import ComposedStep
from trainmem.estimator.memory.workspace import with_workspace
from trainmem.hardware.gpus import find_gpu


def _step(spec, setup, card):
    setup = setup.replace(gpu=card.name).validate(spec)
    return simulated_step(spec, setup, setup.resolved_precision(spec, "cuda"), card)


@pytest.mark.parametrize("model,fields", [
    ("tiny-llama", dict(precision="fp16")),
    ("tiny-llama", dict(precision="amp-bf16", peft="lora", checkpointing=True)),
    ("tiny-qwen3-moe", dict(precision="bf16", grad_accum=2)),
])
def test_an_a100s_step_resized_is_the_h100s_and_back(model, fields):
    spec = ModelSpec.resolve(model)
    setup = TrainSetup(batch_size=2, seq_len=32, **fields)
    a100, h100 = find_gpu("A100-80GB"), find_gpu("H100-80GB")
    assert a100.cublas_workspace != h100.cublas_workspace and a100.flash == h100.flash
    steps = {card.name: _step(spec, setup, card) for card in (a100, h100)}
    for have, want in ((a100, h100), (h100, a100)):
        got, simulated = with_workspace(steps[have.name], want.cublas_workspace), steps[want.name]
        assert got is not None and len(simulated.holds) == 2
        assert list(got.events) == list(simulated.events) and got.marks == simulated.marks
        assert (got.peak, got.peak_split, got.peak_phase) == (simulated.peak, simulated.peak_split,
                                                              simulated.peak_phase)
    assert with_workspace(steps["A100-80GB"], a100.cublas_workspace) is steps["A100-80GB"]  # nothing to resize


def _composed(events, peak, other):
    return ComposedStep(events, {"build": 0}, peak, {"weights": 0, "gradients": 0, "optimizer": 0,
                                                     "activations": 0, "other": other}, "build", False, (1, 3))


def test_a_resize_that_moves_the_peak_to_another_event_asks_for_the_simulation():
    # held 10 at event 0, a 50-byte temporary, the second 10 held, a 35-byte one: the peak (60) is the first
    # temporary's; with 30-byte workspaces the second temporary's (95 > 80) is, whose split no ledger recorded
    events = [(1, 10), (2, 50), (2, -1), (3, 10), (4, 35), (4, -1)]
    step = _composed(events, 60, 60)
    assert with_workspace(step, 30) is None
    smaller = with_workspace(step, 4)  # the peak stays the first temporary's: 4 + 50
    assert smaller is not None and smaller.peak == 54 and smaller.peak_split["other"] == 54
    assert smaller.events == [(1, 4), (2, 50), (2, -1), (3, 4), (4, 35), (4, -1)]


def test_a_step_whose_events_do_not_hold_its_peak_is_not_resized():
    step = _composed([(1, 10), (2, 50), (2, -1), (3, 10)], 70, 70)  # a peak its events never reach
    assert with_workspace(step, 20) is None
