"""Every causal-LM model type that plain transformers trains goes through trainmem: `estimate` simulates it
(not falling back to the analytic method), the analytic method answers (or falls back to the simulation where
its closed form has no terms for the layers), `run --device cpu` works, and the measured model states equal
the estimated ones to the byte (issue 33). One test per model type (`lab/registry.py`: its tiny
config, built from the config class), so a failure names the type.

`test_adapter_variant` estimates every type under `registry.VARIANTS` (LoRA on every Linear, QLoRA), one test
per type and variant: each simulates, or is refused at the door in one line per problem naming its flag.

`BROKEN` lists the types that fail today, each with its root causes (`CAUSES`): they are strict xfails, so
the test is green now and turns red when a fix makes one pass; then take the type (or the cause) out of
`BROKEN`; `VARIANT_BROKEN` does the same for a type under one variant. `NOT_TRAINABLE` lists the types plain
transformers itself does not train as built here: skipped.
`benchmarks/registry.py` writes the same findings, one row per type, to docs/models.md.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

from lab import registry

CAUSES = {
    "MULTIMODAL": "refused by design: AutoModelForCausalLM builds the whole multimodal model (vision tower and "
                  "all), which trainmem does not model; the text config alone is the supported way",
    "HOST_READ_WEIGHTS": "simulate: BLT's patcher reads entropies of its own logits on the host to cut patches: "
                         "data- and weight-dependent shapes",
    "LINEAR_SUBCLASS": "peft adapts an nn.Linear subclass whose forward is not a Linear's as a plain Linear, and its "
                       "LoRA layer fails (a real run too): Llama-4's and Phi-MoE's routers return a tuple, "
                       "DeepSeek-V4's grouped output projection (o_a_proj) is a batched product over head groups",
    "REVERSIBLE": "Reformer's reversible layers are one autograd Function of the hidden states alone: with the "
                  "embeddings frozen (LoRA) its output needs no gradient and the loss has no grad_fn (peft's "
                  "LoRA fails so in a real run too, the default targets included)",
    "HALF_A_FUSED_PAIR": "peft's default targets for afmoe name gate_proj and not up_proj, which transformers 5 fuses "
                         "into the experts' gate_up_proj: peft's conversion refuses one half of the pair",
}
MULTIMODAL, HOST_READ_WEIGHTS, LINEAR_SUBCLASS, REVERSIBLE, HALF_A_FUSED_PAIR = CAUSES


def _installed() -> str:
    import transformers

    return transformers.__version__


def _pinned() -> str | None:
    """The transformers release constraints.txt pins (what CI's first suite and the lists below are about)."""
    root = Path(__file__).resolve().parents[2]
    pins = dict(line.strip().split("==", 1) for line in open(root / "constraints.txt") if "==" in line)
    return pins.get("transformers")


PINNED = _installed() == _pinned()
"""On the pinned transformers every list below is exact (strict xfails, known types). On a newer release (CI's
second suite) types the lists do not know are skipped where plain transformers cannot build or train their tiny
config, and a multimodal refusal is skipped as by design; everything else must pass there too."""

NOT_TRAINABLE = {
    "dbrx": "DbrxForCausalLM reads attn_config.rope_theta, which DbrxAttentionConfig no longer has",
    "gemma3n": "its vision tower needs the timm package, not installed",
    "gemma4_assistant": "the model reads text_config.vocab_size, which Gemma4AssistantConfig's text config lacks",
    "gemma4_unified_assistant": "the model reads text_config.vocab_size, which its text config lacks",
    "git": "GIT's loss needs pixel_values (no image: logits of 0 tokens against 62 labels)",
    "musicgen": "the config class has no defaults (text_encoder, audio_encoder and decoder configs required)",
    "musicgen_melody": "the config class has no defaults (text_encoder, audio_encoder and decoder configs required)",
    "xmod": "X-MOD needs a language set (model.set_default_language) before any forward",
}

BROKEN: dict[str, tuple[str, ...]] = {
    **{t: (MULTIMODAL,) for t in ("fuyu", "gemma3", "gemma4", "gemma4_unified", "got_ocr2")},
    "blt": (HOST_READ_WEIGHTS,),
}


VARIANT_BROKEN: dict[tuple[str, str], tuple[str, ...]] = {
    **{(t, "lora_all_linear"): (LINEAR_SUBCLASS,) for t in ("deepseek_v4", "llama4", "llama4_text", "phimoe")},
    **{("reformer", v): (REVERSIBLE,) for v in ("lora_all_linear", "qlora")},
    ("deepseek_v4", "qlora"): (LINEAR_SUBCLASS,),
    ("afmoe", "qlora"): (HALF_A_FUSED_PAIR,),
}
"""The (type, `registry.VARIANTS` entry) pairs that fail today beyond the type's own `BROKEN` causes."""


def _params() -> list:
    out = []
    for t in registry.model_types():
        marks = []
        if t in NOT_TRAINABLE:
            marks.append(pytest.mark.skip(reason=f"plain transformers does not train it: {NOT_TRAINABLE[t]}"))
        elif t in BROKEN:
            marks.append(pytest.mark.xfail(strict=PINNED, reason="; ".join(CAUSES[c] for c in BROKEN[t])))
        out.append(pytest.param(t, marks=marks, id=t))
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one intra-op thread is as fast, and two fight over a shared CI machine's cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _variant_params() -> list:
    out = []
    for t in registry.model_types():
        for v in registry.VARIANTS:
            marks = []
            causes = BROKEN.get(t, ()) + VARIANT_BROKEN.get((t, v), ())
            if t in NOT_TRAINABLE:
                marks.append(pytest.mark.skip(reason=f"plain transformers does not train it: {NOT_TRAINABLE[t]}"))
            elif causes:
                marks.append(pytest.mark.xfail(strict=PINNED, reason="; ".join(CAUSES[c] for c in causes)))
            out.append(pytest.param(t, v, marks=marks, id=f"{t}-{v}"))
    return out


def test_lists_name_known_types():
    types = set(registry.model_types())
    assert not PINNED or not (set(NOT_TRAINABLE) | set(BROKEN) | {t for t, _ in VARIANT_BROKEN}) - types
    assert not set(NOT_TRAINABLE) & (set(BROKEN) | {t for t, _ in VARIANT_BROKEN})
    assert {v for _, v in VARIANT_BROKEN} <= set(registry.VARIANTS)
    assert all(c in CAUSES for causes in (*BROKEN.values(), *VARIANT_BROKEN.values()) for c in causes)


@pytest.mark.filterwarnings("ignore")  # transformers' and peft's warnings about toy configs
@pytest.mark.parametrize("model_type", _params())
def test_model_type(model_type):
    from trainmem.config.setup import TrainSetup
    from trainmem.estimator import estimate
    from trainmem.isolation.runner import run

    from trainmem.errors import SetupError

    try:
        config = registry.tiny_config(model_type)
        registry.plain_step(config)  # plain transformers trains it, else the type belongs in NOT_TRAINABLE
    except Exception as e:
        if PINNED:
            raise
        pytest.skip(f"transformers {_installed()}, not the pinned release the lists name: a tiny {model_type} "
                    f"does not build or train in plain transformers ({registry.one_line(e)})")
    try:
        spec = registry.spec_of(model_type, config)
    except SetupError as e:
        if PINNED or "a multimodal model" not in str(e):
            raise
        pytest.skip(f"{CAUSES[MULTIMODAL]} (transformers {_installed()})")
    setup = TrainSetup(batch_size=registry.BATCH, seq_len=registry.SEQ, device="cpu", precision="fp32")
    simulated = estimate(spec, setup, "simulate")
    assert simulated.method == "simulate", simulated.notes  # not the analytic fallback
    analytic = estimate(spec, setup, "analytic")  # the simulation where the closed form lacks the layers' terms
    measured = run(spec, setup.replace(steps=1), isolate=False)  # the states exist after the first step
    assert measured.status == "ok", measured.error
    assert simulated.model_states == measured.model_states
    assert analytic.model_states == measured.model_states


@functools.lru_cache(maxsize=1)  # the variants of one type run one after the other: one config and spec for both
def _spec(model_type: str) -> Any:
    return registry.spec_of(model_type, registry.tiny_config(model_type))


REFUSING_FLAG = re.compile(r"--(peft qlora|lora-targets|lora-r)\b")
"""The flags a variant's refusal may name: those the variant sets (`registry.VARIANTS`)."""


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_type, variant", _variant_params())
def test_adapter_variant(model_type, variant):
    """LoRA on every Linear and QLoRA (the estimate: a 4-bit run needs a GPU) either simulate, or are refused at
    the door, each problem in one line that names the flag and the reason; never an internal error (issue 41)."""
    from trainmem.config.setup import TrainSetup
    from trainmem.errors import SetupError

    try:
        spec = _spec(model_type)
    except SetupError as e:
        if PINNED or "a multimodal model" not in str(e):
            raise
        pytest.skip(f"{CAUSES[MULTIMODAL]} (transformers {_installed()})")
    except Exception as e:
        if PINNED:
            raise
        pytest.skip(f"transformers {_installed()}: a tiny {model_type} does not build ({registry.one_line(e)})")
    setup = TrainSetup(batch_size=registry.BATCH, seq_len=registry.SEQ, device="cpu", precision="fp32")
    try:
        answer = registry.variant(spec, setup, variant)
    except SetupError as e:
        assert e.problems  # each problem one line naming its flag (hunyuan_v1_moe's all-linear has two)
        for line in e.problems:
            assert "\n" not in line and "Traceback" not in line, line
            assert REFUSING_FLAG.match(line), line
        return
    assert answer.method == "simulate", answer.notes  # not the analytic fallback
    assert answer.model_states["gradients"] > 0  # the adapters train
