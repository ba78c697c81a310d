"""What the loss reaches in a deep model of alike layers, read from the model cut to three layers, is what a
step of the whole model reaches (`states.reached_by_cut`)."""

from __future__ import annotations

from typing import Any

import pytest

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.estimator.memory import states

SETUPS = {
    "lora": ("tiny-llama", dict(peft="lora")),
    "qlora": ("tiny-llama", dict(peft="qlora")),
    "mixture of experts": ("tiny-qwen3-moe", dict(peft="lora")),
    "full, gpt2's names": ("tiny-gpt2", dict()),
}


def _model(name: str, fields: dict[str, Any], layers: int) -> tuple[Any, ModelSpec, TrainSetup, str]:
    spec = ModelSpec.resolve(name).cut(layers)
    setup = TrainSetup(**fields).validate(spec)
    precision = setup.resolved_precision(spec, "cuda")
    return states.meta_model(spec, setup, precision), spec, setup, precision


@pytest.mark.parametrize("case", list(SETUPS))
def test_the_cut_reaches_what_the_whole_model_reaches(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, spec, setup, precision = _model(*SETUPS[case], layers=24)
    depths: list[int] = []
    whole = states.reached

    def counted(m: Any, s: ModelSpec) -> Any:
        depths.append(int(s.text_config().num_hidden_layers))
        return whole(m, s)

    monkeypatch.setattr(states, "reached", counted)
    by_cut = states.reached_by_cut(model, spec, setup, precision)
    assert depths == [states.REACH_CUT]  # the cut model's step, not the whole one
    assert by_cut == whole(model, spec) and by_cut


def test_each_layer_takes_the_reach_of_its_place_in_the_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first layer as the cut's first, the last as its last, the others as its middle one: a middle layer
    the loss does not reach in the cut leaves every middle layer of the model unreached."""
    model, spec, setup, precision = _model("tiny-llama", dict(peft="lora"), layers=24)
    whole = states.reached
    monkeypatch.setattr(states, "reached", lambda m, s: {n for n in whole(m, s) if ".layers.1." not in n})
    hit = states.reached_by_cut(model, spec, setup, precision)
    assert hit is not None
    layers = {int(n.split(".layers.")[1].split(".")[0]) for n in hit}
    assert layers == {0, 23}


def test_layers_that_differ_or_are_few_are_stepped_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    depths: list[int] = []
    whole = states.reached
    monkeypatch.setattr(states, "reached",
                        lambda m, s: depths.append(int(s.text_config().num_hidden_layers)) or whole(m, s))
    model, spec, setup, precision = _model("tiny-llama", dict(peft="lora"), layers=8)
    states.reached_by_cut(model, spec, setup, precision)
    model, spec, setup, precision = _model("gemma-3-1b", dict(peft="lora"), layers=24)  # sliding and full layers
    states.reached_by_cut(model, spec, setup, precision)
    assert depths == [8, 24]
