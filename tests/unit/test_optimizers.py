"""One table of optimizers (config/optimizers.py) and one builder each (measure/build.py BUILDERS): adding an
optimizer is a row plus its builder, and every layer that prices or trains it reads them."""

from __future__ import annotations

import pytest
import torch

from trainmem import ModelSpec, TrainSetup, estimate
from trainmem.config import optimizers
from trainmem.config.setup import from_training_arguments
from trainmem.isolation.engines import execute
from trainmem.measure import build

TINY = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu")

RMSPROP = optimizers.Optimizer(
    "rmsprop", "rmsprop", "torch RMSprop: 1 state", lambda n, shape, d: n * d + 4,  # square_avg + fp32 step
    passes=10.0, step_scalar=True)


@pytest.fixture
def rmsprop(monkeypatch):
    """torch's RMSprop added as a new optimizer would be: its row and its builder, nothing else."""
    monkeypatch.setitem(optimizers.OPTIMIZERS, "rmsprop", RMSPROP)
    monkeypatch.setitem(build.BUILDERS, "rmsprop", lambda params, lr: torch.optim.RMSprop(params, lr=lr))
    return "rmsprop"


def test_every_row_has_a_builder_and_a_trainer_name():
    assert list(build.BUILDERS) == list(optimizers.OPTIMIZERS)
    from transformers.training_args import OptimizerNames

    assert {o.trainer for o in optimizers.OPTIMIZERS.values()} <= {n.value for n in OptimizerNames}
    assert all(optimizers.by_trainer_name(o.trainer) == o.name for o in optimizers.OPTIMIZERS.values())


def test_an_optimizer_added_as_one_row_and_its_builder_is_trained_and_priced_exactly(rmsprop, tmp_path):
    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(**TINY, optimizer=rmsprop)
    measured = execute(spec, setup)  # in this process: the fixture's row and builder are seen
    assert measured.status == "ok", measured.error
    params = [p for p in build.build_model(spec, setup, "cpu", "fp32").parameters() if p.requires_grad]
    by_hand = sum(p.numel() * 4 + 4 for p in params)  # fp32 square_avg + step per tensor
    assert measured.model_states["optimizer"] == by_hand
    cuda = setup.replace(precision=setup.resolved_precision(spec, "cpu"))
    for method in ("analytic", "simulate"):
        b = estimate(spec, cuda, method)
        assert b.model_states == measured.model_states, method
    assert b.time is not None and b.time["step_s"] > 0
    assert setup.to_training_arguments(str(tmp_path)).optim == "rmsprop"


def test_an_unknown_optimizer_is_one_line_naming_the_flag():
    with pytest.raises(Exception, match=r"--optimizer: 'rmsprop' is not one of adamw, adamw-fused"):
        TrainSetup(optimizer="rmsprop").validate(ModelSpec.resolve("tiny-llama"))


def test_trainer_names_map_back():
    class Args:  # the fields from_training_arguments reads, as TrainingArguments has them
        per_device_train_batch_size, gradient_accumulation_steps, gradient_checkpointing = 4, 2, False
        learning_rate, seed, optim = 1e-4, 0, "adamw_bnb_8bit"

    assert from_training_arguments(Args()).optimizer == "adamw-8bit"
    Args.optim = "adamw_8bit"
    assert from_training_arguments(Args()).optimizer == "adamw-8bit"
