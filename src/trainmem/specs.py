"""Model specs: what model a setup trains, as data with a source.

A `ModelSpec` is a Hugging Face config (a plain dict, exactly as `config.json` holds it) plus where it
came from. It can be built from a built-in preset (exact published configs; weights are random because
no weights are downloaded), a `config.json` path, a local model folder (config, weights, tokenizer), a
hub id in the local Hugging Face cache, or a hub id whose `config.json` (a few KB, never the weights) is
fetched from the Hub. Parameter counts come from a meta-device model (no memory, no init), the same way
`accelerate estimate-memory` counts them.
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
    "gemma-3-1b": dict(
        model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, dtype="bfloat16",
    ),
    "phi-2": dict(
        model_type="phi", hidden_size=2560, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=10240, vocab_size=51200, max_position_embeddings=2048,
        partial_rotary_factor=0.4, layer_norm_eps=1e-5, rope_theta=10000.0, qk_layernorm=False,
        resid_pdrop=0.1, embd_pdrop=0.0, attention_dropout=0.0, hidden_act="gelu_new",
        tie_word_embeddings=False, dtype="float16",
    ),
    "stablelm-2-1.6b": dict(
        model_type="stablelm", hidden_size=2048, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=5632, vocab_size=100352, max_position_embeddings=4096,
        partial_rotary_factor=0.25, layer_norm_eps=1e-5, rope_theta=10000.0, use_qkv_bias=True,
        qk_layernorm=False, use_parallel_residual=False, hidden_act="silu", tie_word_embeddings=False,
        dtype="float16",
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
    """`preset`, `config` or `hub` (random weights), `dir` or `cache` (local weights)."""
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
        """`org/name[@revision]` from the local Hugging Face cache (its newest snapshot), or None."""
        from huggingface_hub import try_to_load_from_cache

        repo, revision = split_revision(model_id)
        try:
            found = try_to_load_from_cache(repo, "config.json", revision=revision)
        except ValueError:  # not a valid repo id: not in the cache either
            return None
        if not isinstance(found, str):
            return None
        spec = cls.from_dir(Path(found).parent, source="cache")
        if spec.has_weights:
            return spec
        # only the config is cached (what `from_hub` fetches): random weights, named as the user did
        return cls(name=model_id, config=spec.config, source="hub")

    @classmethod
    def from_hub(cls, model_id: str) -> ModelSpec:
        """`org/name[@revision]`: its `config.json` fetched from the Hub into the Hugging Face cache (never
        the weights), so that a second call reads the cache, offline too. Honours HF_TOKEN, HF_ENDPOINT
        and HF_HUB_OFFLINE as every Hugging Face library does; each failure says what to pass instead."""
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub import errors as hub

        repo, revision = split_revision(model_id)
        where = f"on the Hub ({constants.ENDPOINT})"
        instead = ("or pass a config.json path, a local folder made by save_pretrained, or a preset: "
                   f"{', '.join(p for p in PRESETS if not p.startswith('tiny-'))}")
        try:
            path = hf_hub_download(repo, "config.json", revision=revision)
        except hub.GatedRepoError:
            problem = (f"{repo} is gated {where}: accept its licence on the model's page, then set HF_TOKEN "
                       f"to a token of that account (or run `hf auth login`); {instead}")
        except hub.RepositoryNotFoundError:
            problem = (f"no repository {repo!r} {where}: check the id (org/name), or set HF_TOKEN if it is "
                       f"private; {instead}")
        except hub.RevisionNotFoundError:
            problem = f"{repo} has no revision {revision!r} {where}: name a branch, tag or commit; {instead}"
        except hub.RemoteEntryNotFoundError:
            problem = f"{repo} has no config.json {where}: is it a transformers model? {instead}"
        except hub.LocalEntryNotFoundError:  # offline, or the Hub unreachable, and nothing cached
            reason = ("HF_HUB_OFFLINE is set" if constants.is_offline_mode()
                      else f"the Hub ({constants.ENDPOINT}) cannot be reached")
            problem = (f"{model_id!r} is not in the local Hugging Face cache and {reason}: connect once to "
                       f"cache its config.json (set HF_ENDPOINT for a mirror), {instead}")
        except hub.HFValidationError:
            problem = f"{model_id!r} is neither a local path nor a hub id (org/name[@revision]); {instead}"
        except hub.HfHubHTTPError as e:
            problem = f"the Hub refused {model_id!r} ({e.response.status_code}); {instead}"
        else:
            spec = cls.from_config_file(path)
            return cls(name=model_id, config=spec.config, source="hub")
        raise SetupError([f"--model: {problem}"])

    @classmethod
    def resolve(cls, name: str) -> ModelSpec:
        """Any of: local folder, config.json path, hub id (`org/name[@revision]`), preset.

        A hub id is read from the local cache when it is there, else it is a preset's hub id (the exact
        preset config, no network), else its `config.json` is fetched from the Hub.
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
            return cls.from_hub(name)
        return cls.from_preset(name)

    # --- derived facts ----------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        """The config's `model_type` (gpt_neox, llama, ...): what picks the transformers class."""
        return str(self.config["model_type"])

    @property
    def has_weights(self) -> bool:
        """Whether a local folder holds real weights; else the model is built with random ones."""
        return self.path is not None and self.source in ("dir", "cache")

    def hf_config(self, **overrides: Any):
        """A fresh transformers `PretrainedConfig` for this spec."""
        from transformers import CONFIG_MAPPING

        fields = {k: v for k, v in self.config.items() if k != "model_type"}
        fields.update(overrides)
        return CONFIG_MAPPING[self.model_type](**fields)

    @cached_property
    def _meta(self) -> tuple[int, dict[str, str]]:
        """One meta-device model (no memory, no init), read for its parameter count and its modules."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.hf_config())
        return sum(p.numel() for p in model.parameters()), {n: type(m).__name__ for n, m in model.named_modules()}

    @property
    def parameter_count(self) -> int:
        """Parameters as `model.parameters()` counts them (tied embeddings once), from a meta-device model."""
        return self._meta[0]

    @property
    def modules(self) -> dict[str, str]:
        """Every module's qualified name -> its class name, from a meta-device model: what `--lora-targets`
        can name, known before anything is built."""
        return self._meta[1]

    @property
    def model_class(self) -> type | None:
        """The transformers class `AutoModelForCausalLM` builds for this config (None if it knows none)."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        try:
            return MODEL_FOR_CAUSAL_LM_MAPPING[type(self.hf_config())]
        except KeyError:
            return None

    @property
    def attentions(self) -> tuple[str, ...]:
        """The attention kernels (of `sdpa`, `eager`) the installed transformers lets this model use, its
        default first: sdpa where the class declares `_supports_sdpa` (transformers then takes it without
        being asked), else eager. Transformers never picks flash_attention_2 unless asked, so neither do we."""
        cls = self.model_class
        return ("eager",) if cls is not None and not cls._supports_sdpa else ("sdpa", "eager")

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the config allows, None where it names none."""
        cfg = self.hf_config()
        return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary: the dummy data's ids and the logits' width."""
        return int(self.hf_config().vocab_size)

    @property
    def stored_dtype(self) -> str:
        """The dtype the checkpoint is stored in (what `torch_dtype="auto"` loads), float32 if unknown."""
        dtype = self.config.get("dtype") or self.config.get("torch_dtype") or "float32"
        return str(dtype).replace("torch.", "")

    def describe(self) -> dict[str, Any]:
        """What a row records about the model: name, source, type, path, parameter count."""
        return {"name": self.name, "source": self.source, "model_type": self.model_type,
                "path": self.path, "parameters": self.parameter_count}


def split_revision(model_id: str) -> tuple[str, str | None]:
    """`org/name@rev` -> (`org/name`, `rev`); no `@` -> revision None (the default branch)."""
    repo, _, revision = model_id.partition("@")
    return repo, revision or None
