"""The simulation's ledger allocates what a training step without a dispatch mode allocates (`estimator.inplace`).

Run on the CPU with real tensors: the profiler records every allocation, and the step run with no mode at all is
the reference. Under a plain TensorLedger autograd accumulates gradients out of place and the math SDPA path
adds its mask out of place; the SimulatedLedger puts both back.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile

from trainmem.estimator.memory.simulate import SimulatedLedger
from trainmem.estimator.memory.standins import cuda_choices
from trainmem.measure.ledger import StateBytes, TensorLedger


def _llama(checkpointing: bool) -> Any:
    torch.manual_seed(0)
    # grouped KV heads with no mask: transformers passes enable_gqa, and fp32 with grouped heads is CUDA's
    # math path (`simulate.sdpa_kernel`), which builds the causal mask and adds it to the scores
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _allocations(step: Callable[[], None]) -> list[int]:
    """Sizes of the step's allocations in order, those of 1 KiB or less left out: scalars (a mode wraps Python
    numbers as tensors) and the host's small index tensors (packed-sequence detection, which the simulation
    skips)."""
    with profile(profile_memory=True) as prof, sdpa_kernel(SDPBackend.MATH):  # the math path on the CPU too
        step()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    return [e.nbytes() for e in events if e.name() == "[memory]" and e.nbytes() > 1024]


def _step(model: Any, ids: torch.Tensor, ledger: TensorLedger | None) -> Callable[[], None]:
    def run() -> None:
        if ledger is None:
            model(input_ids=ids, labels=ids).loss.backward()
        else:
            inplace = getattr(ledger, "inplace", None)
            with cuda_choices("sdpa", flash=False, inplace=inplace), ledger:
                loss = model(input_ids=ids, labels=ids).loss
                if inplace is not None:
                    inplace.watch(loss.grad_fn)
                loss.backward()
        model.zero_grad(set_to_none=True)
    return run


@pytest.mark.parametrize("checkpointing", [False, True])
def test_simulated_ledger_allocates_as_a_step_without_a_mode(checkpointing: bool) -> None:
    model = _llama(checkpointing)
    ids = torch.randint(0, 1000, (2, 32))
    _allocations(_step(model, ids, None))  # first step: lazy initialisations out of the way
    reference = _allocations(_step(model, ids, None))
    plain = _allocations(_step(model, ids, TensorLedger(lambda: StateBytes(0, 0, 0))))
    simulated = _allocations(_step(model, ids, SimulatedLedger(lambda: StateBytes(0, 0, 0))))
    assert len(plain) > len(reference)  # the out-of-place adds: what the simulation has to undo
    assert simulated == reference


def _gpt2_lora() -> Any:
    import peft

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4))
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["c_attn"], lora_dropout=0.0,
                                                       fan_in_fan_out=True))
    model.enable_input_require_grads()
    return model


_SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)
MODELS: dict[str, Callable[[], Any]] = {
    "gpt2-lora": _gpt2_lora,  # tied weights, LoRA
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**_SMALL, head_dim=16,
                                                                                     sliding_window=8)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_SMALL)),
    "neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        **{k: v for k, v in _SMALL.items() if k != "num_key_value_heads"})),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_accumulations_in_place_exactly_where_the_engine_does_them(name: str) -> None:
    """Each accumulation the engine runs without a mode (the profiler names `add_` or `add` directly under the
    engine's evaluate_function) against InPlace's rewrite of it, checkpointing on."""
    torch.manual_seed(0)
    model = MODELS[name]()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 128, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    with profile() as prof:
        loss.backward()
    engine = [e.name.removeprefix("aten::") for e in sorted(prof.events(), key=lambda e: e.time_range.start)
              if e.name in ("aten::add", "aten::add_") and e.cpu_parent is not None
              and e.cpu_parent.name.startswith("autograd::engine::evaluate_function")]
    model.zero_grad(set_to_none=True)

    ledger = SimulatedLedger(lambda: StateBytes(0, 0, 0))
    rewritten: list[str] = []
    add = ledger.inplace.add

    def spy(func: Any, args: tuple) -> torch.Tensor | None:
        done = add(func, args)
        if ledger.inplace.between and func is torch.ops.aten.add.Tensor and not torch.is_grad_enabled():
            rewritten.append("add" if done is None else "add_")
        return done

    ledger.inplace.add = spy  # type: ignore[method-assign]
    with ledger:
        loss = model(input_ids=ids, labels=ids).loss
        ledger.inplace.watch(loss.grad_fn)
        loss.backward()
    assert "add_" in engine  # accumulations happen, in place
    # and out of place where the first gradient is shared (a view's base alive, a pass-through to two edges)
    assert "add" in engine
    assert rewritten == engine
