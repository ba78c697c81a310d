"""Model specs: what model a setup trains, as data with a source.

A `ModelSpec` is a Hugging Face config (a plain dict, exactly as `config.json` holds it) plus where it
came from. It can be built from a built-in preset (exact published configs; weights are random because
no weights can be downloaded offline), a `config.json` path, a local model folder (config, weights,
tokenizer), or a hub id that is already in the local Hugging Face cache. Parameter counts come from a
meta-device model (no memory, no init), the same way `accelerate estimate-memory` counts them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .errors import SetupError

# Exact architecture fields of the published checkpoints' config.json files. Fields that do not change
# the graph or the memory (bos/eos ids, initializer ranges) are left at the library defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "polyglot-ko-1.3b": dict(
        model_type="gpt_neox", hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=8192, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "polyglot-ko-3.8b": dict(
        model_type="gpt_neox", hidden_size=3072, num_hidden_layers=32, num_attention_heads=24,
        intermediate_size=12288, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "polyglot-ko-5.8b": dict(
        model_type="gpt_neox", hidden_size=4096, num_hidden_layers=28, num_attention_heads=16,
        intermediate_size=16384, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "polyglot-ko-12.8b": dict(
        model_type="gpt_neox", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
        intermediate_size=20480, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
        dtype="bfloat16",
    ),
    "llama-3.2-3b": dict(
        model_type="llama", hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
        dtype="bfloat16",
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
        dtype="bfloat16",
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
        dtype="bfloat16",
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
        dtype="bfloat16",
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu",
        dtype="bfloat16",
    ),
    "mistral-7b": dict(
        model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False,
        hidden_act="silu", dtype="bfloat16",
    ),
    "gpt2": dict(
        model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
        activation_function="gelu_new", tie_word_embeddings=True, dtype="float32",
    ),
    "gemma-2-2b": dict(
        model_type="gemma2", hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, dtype="float32",
    ),
    "phi-3-mini": dict(
        model_type="phi3", hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=8192, vocab_size=32064, max_position_embeddings=4096,
        original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=2047,
        tie_word_embeddings=False, hidden_act="silu", pad_token_id=32000, dtype="bfloat16",
    ),
    "olmo-2-1b": dict(
        model_type="olmo2", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=8192, vocab_size=100352, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False, hidden_act="silu",
        pad_token_id=100277, dtype="float32",
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        hidden_act="silu", dtype="bfloat16",
    ),
    # Tiny presets: the same architectures at toy size, for tests and for CPU runs in seconds.
    "tiny-gpt-neox": dict(
        model_type="gpt_neox", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, vocab_size=1024, max_position_embeddings=512, rotary_pct=0.5,
        use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu", dtype="float32",
    ),
    "tiny-llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=176, vocab_size=1024, max_position_embeddings=512,
        tie_word_embeddings=False, hidden_act="silu", dtype="float32",
    ),
    "tiny-qwen2": dict(
        model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=176, vocab_size=1024, max_position_embeddings=512,
        tie_word_embeddings=True, hidden_act="silu", dtype="float32",
    ),
    "tiny-gpt2": dict(
        model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=1024, n_positions=512,
        tie_word_embeddings=True, dtype="float32",
    ),
}

# The seed's model id and the hub ids of the presets, so that `--model EleutherAI/polyglot-ko-1.3b`
# works offline (random weights) when the checkpoint is not in the local cache.
HUB_IDS: dict[str, str] = {
    "EleutherAI/polyglot-ko-1.3b": "polyglot-ko-1.3b",
    "EleutherAI/polyglot-ko-3.8b": "polyglot-ko-3.8b",
    "EleutherAI/polyglot-ko-5.8b": "polyglot-ko-5.8b",
    "EleutherAI/polyglot-ko-12.8b": "polyglot-ko-12.8b",
    "meta-llama/Llama-3.2-1B": "llama-3.2-1b",
    "meta-llama/Llama-3.2-3B": "llama-3.2-3b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "openai-community/gpt2": "gpt2",
    "google/gemma-2-2b": "gemma-2-2b",
    "microsoft/Phi-3-mini-4k-instruct": "phi-3-mini",
    "allenai/OLMo-2-0425-1B": "olmo-2-1b",
    "Qwen/Qwen3-0.6B": "qwen3-0.6b",
}


@dataclass(frozen=True)
class ModelSpec:
    """A causal LM to train: its Hugging Face config and where it came from."""

    name: str
    """What the user called it: a preset name, a path or a hub id."""
    config: dict[str, Any] = field(hash=False)
    """The config.json contents (must hold `model_type`)."""
    source: str = "preset"
    """`preset` (random weights), `config` (random weights), `dir` (local weights) or `cache`."""
    path: str | None = None
    """Folder with weights and tokenizer (sources `dir` and `cache`); None for random weights."""

    # --- constructors -------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str) -> ModelSpec:
        """A built-in preset; raises SetupError listing the presets for an unknown name."""
        key = HUB_IDS.get(name, name)
        if key not in PRESETS:
            raise SetupError([f"--model: unknown preset {name!r}. Presets: {', '.join(PRESETS)}; "
                              "or pass a config.json path, a local model folder, or a hub id "
                              "that is in the local Hugging Face cache."])
        return cls(name=key, config=dict(PRESETS[key]), source="preset")

    @classmethod
    def from_config_file(cls, path: str | os.PathLike) -> ModelSpec:
        """A `config.json` file: the architecture only, trained from random weights."""
        p = Path(path)
        try:
            config = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise SetupError([f"--model: cannot read config {str(p)!r}: {e}"]) from None
        if "model_type" not in config:
            raise SetupError([f"--model: {str(p)!r} has no 'model_type'; is it a Hugging Face config.json?"])
        return cls(name=str(p), config=config, source="config")

    @classmethod
    def from_dir(cls, path: str | os.PathLike, source: str = "dir") -> ModelSpec:
        """A local model folder as `save_pretrained` writes it (config.json, weights, tokenizer)."""
        p = Path(path)
        spec = cls.from_config_file(p / "config.json")
        has_weights = any(p.glob("*.safetensors")) or any(p.glob("*.bin"))
        return cls(name=str(path), config=spec.config, source=source if has_weights else "config",
                   path=str(p))

    @classmethod
    def from_hub_cache(cls, model_id: str) -> ModelSpec | None:
        """The newest snapshot of `model_id` in the local Hugging Face cache, or None."""
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
        if isinstance(found, str):
            return cls.from_dir(Path(found).parent, source="cache")
        return None

    @classmethod
    def resolve(cls, name: str) -> ModelSpec:
        """Any of: local folder, config.json path, hub id in the local cache, preset (in that order).

        A hub id of a preset that is not cached falls back to the preset with random weights, since
        nothing can be downloaded; other hub ids fail with a message that says what to pass instead.
        """
        p = Path(name)
        if p.is_dir():
            return cls.from_dir(p)
        if p.is_file():
            return cls.from_config_file(p)
        if "/" in name:
            cached = cls.from_hub_cache(name)
            if cached is not None:
                return cached
            if name in HUB_IDS:
                return cls.from_preset(name)
            raise SetupError([f"--model: {name!r} is neither a local folder, a config.json, a preset, nor "
                              "in the local Hugging Face cache (nothing is downloaded). Pass a folder "
                              "made by save_pretrained, a config.json path, or a preset: "
                              f"{', '.join(PRESETS)}."])
        return cls.from_preset(name)

    # --- derived facts ----------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])

    @property
    def has_weights(self) -> bool:
        return self.path is not None and self.source in ("dir", "cache")

    def hf_config(self, **overrides: Any):
        """A fresh transformers `PretrainedConfig` for this spec."""
        from transformers import CONFIG_MAPPING

        fields = {k: v for k, v in self.config.items() if k != "model_type"}
        fields.update(overrides)
        return CONFIG_MAPPING[self.model_type](**fields)

    @cached_property
    def parameter_count(self) -> int:
        """Parameters as `model.parameters()` counts them (tied embeddings once), from a meta-device model."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.hf_config())
        return sum(p.numel() for p in model.parameters())

    @property
    def max_positions(self) -> int | None:
        cfg = self.hf_config()
        return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config().vocab_size)

    @property
    def stored_dtype(self) -> str:
        """The dtype the checkpoint is stored in (what `torch_dtype="auto"` loads), float32 if unknown."""
        dtype = self.config.get("dtype") or self.config.get("torch_dtype") or "float32"
        return str(dtype).replace("torch.", "")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "model_type": self.model_type,
                "path": self.path, "parameters": self.parameter_count}
