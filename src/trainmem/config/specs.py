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
import re
import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trainmem.errors import SetupError

from .presets import HUB_IDS, PRESETS


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
        """A `config.json` file: the architecture only, trained from random weights. Raises SetupError where
        it is no causal LM's config (`causal_config`)."""
        p = Path(path)
        try:
            config = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SetupError([f"--model: cannot read config {str(p)!r}: {e}"]) from None
        return cls(name=str(p), config=causal_config(special_floats(config), str(p)), source="config")

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

    def meta_model(self) -> Any:
        """A new model of this config on the meta device (no memory, no init), built outside any dispatch mode:
        read from inside a simulation (a cut model's), its tensors are not the step's."""
        import torch
        from torch.utils._python_dispatch import _disable_current_modes
        from transformers import AutoModelForCausalLM

        with _disable_current_modes(), torch.device("meta"):
            return AutoModelForCausalLM.from_config(self.hf_config())

    @cached_property
    def _meta(self) -> tuple[int, dict[str, str], dict[str, tuple[int, ...]], str | None, tuple[str, ...], str]:
        """One meta-device model, read for its parameter count, its modules, their weights' shapes, the name of its
        output embedding, its fused expert weights and its model type."""
        import torch

        model = self.meta_model()
        head = model.get_output_embeddings()
        modules = dict(model.named_modules())
        shapes = {n: tuple(m.weight.shape) for n, m in modules.items()
                  if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2}
        experts = sorted({re.sub(r"^.*?\.\d+\.", "", n) for n, p in model.named_parameters()
                          if p.dim() == 3 and ".experts." in n})
        return (sum(p.numel() for p in model.parameters()), {n: _kind(m) for n, m in modules.items()},
                shapes, next((n for n, m in modules.items() if m is head), None), tuple(experts),
                str(model.config.model_type))

    def build_problem(self) -> str | None:
        """Why transformers cannot build this model (on the meta device: no memory) although it loads the config:
        an activation it does not know, a padding id past the vocabulary, a RoPE type it lacks; None if it can."""
        from transformers import __version__

        try:
            _ = self._meta  # built (and cached) here, or the reason it cannot be
        except Exception as e:  # whatever the model's __init__ raises
            reason = " ".join(str(e).split()) or type(e).__name__
            return (f"--model: {self.name}: transformers {__version__} cannot build the model from this config: "
                    f"{type(e).__name__}: {reason}")
        return None

    @property
    def parameter_count(self) -> int:
        """Parameters as `model.parameters()` counts them (tied embeddings once), from a meta-device model."""
        return self._meta[0]

    @property
    def modules(self) -> dict[str, str]:
        """Every module's qualified name -> its kind, from a meta-device model: what `--lora-targets` can name,
        known before anything is built. The kind is the class peft's LoRA adapts it as where it is one
        (`Linear` for a subclass such as Falcon's `FalconLinear`), else its own class name."""
        return self._meta[1]

    @property
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each module with a 2-D weight (Linear, Conv1D, Embedding) -> the weight's shape: what bounds the
        rank of a LoRA adapter on it."""
        return self._meta[2]

    @property
    def expert_parameters(self) -> tuple[str, ...]:
        """A mixture of experts' fused 3-D expert weights, named from their decoder layer on
        (`mlp.experts.gate_up_proj`): what `--lora-experts` hands peft as `target_parameters`. Empty for a model
        without them (dense models, experts kept as separate Linears)."""
        return self._meta[4]

    @property
    def built_model_type(self) -> str:
        """The `model_type` of the model `AutoModelForCausalLM` builds: the config's, or its text model's where it
        builds that from a composite config (llama4 -> llama4_text). What peft looks its rules up by."""
        return self._meta[5]

    @property
    def output_embedding(self) -> str | None:
        """The output head's module name (`lm_head`, `embed_out`): what `all-linear` leaves out."""
        return self._meta[3]

    @cached_property
    def model_class(self) -> type | None:
        """The transformers class `AutoModelForCausalLM` builds for this config (None if it knows none); read
        once per spec (it builds a config, milliseconds that the every-card table paid several times a card)."""
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

    def text_config(self) -> Any:
        """The config of the language model that is trained: the config itself, or, where AutoModelForCausalLM
        builds the text model from a composite config (Emu3, Mllama: `causal_config` keeps those whole), its
        `text_config`, as transformers' `get_text_config(decoder=True)` picks it."""
        return self.hf_config().get_text_config(decoder=True)

    def cut(self, layers: int, layer_type: str | None = None) -> ModelSpec:
        """This model with its first `layers` decoder layers only (per-layer lists of the config cut to match),
        or with `layers` of one `layer_type` (`sliding_attention`, `full_attention`); in a composite config
        (Emu3, Mllama), of its `text_config`. The step-time model traces cut models, and the simulation composes
        a deep model's step from them (`estimator.memory.compose`)."""
        config = dict(self.config)
        text = dict(config["text_config"]) if isinstance(config.get("text_config"), dict) else config
        text["n_layer" if "n_layer" in text and "num_hidden_layers" not in text else "num_hidden_layers"] = layers
        if layer_type:
            text["layer_types"] = [layer_type] * layers
        elif isinstance(text.get("layer_types"), list):
            text["layer_types"] = text["layer_types"][:layers]
        if text is not config:
            config["text_config"] = text
        kind = f" {layer_type}" if layer_type else ""
        return dataclasses.replace(self, name=f"{self.name} [{layers}{kind} layers]", config=config)

    @cached_property
    def max_positions(self) -> int | None:
        """The longest sequence the config allows, None where it names none (XLNet's -1: no limit)."""
        cfg = self.text_config()
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        return limit if isinstance(limit, int) and limit > 0 else None

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary: the dummy data's ids and the logits' width."""
        return int(self.text_config().vocab_size)

    @property
    def stored_dtype(self) -> str:
        """The dtype the checkpoint is stored in (what `torch_dtype="auto"` loads), float32 if unknown."""
        dtype = self.config.get("dtype") or self.config.get("torch_dtype") or "float32"
        return str(dtype).replace("torch.", "")

    @property
    def qlora_refusal(self) -> str | None:
        """Why this model cannot train with 4-bit weights (`QLORA_REFUSED`), None where it can."""
        kinds = set(self.modules.values())
        return next((why for cls, why in QLORA_REFUSED.items() if cls in kinds), None)

    def describe(self) -> dict[str, Any]:
        """What a row records about the model: name, source, type, path, parameter count."""
        return {"name": self.name, "source": self.source, "model_type": self.model_type,
                "path": self.path, "parameters": self.parameter_count}


def _kind(module: Any) -> str:
    """The class peft's LoRA would adapt `module` as (its `dispatch_default` tests with isinstance), else the
    module's own class name."""
    import torch
    from transformers.pytorch_utils import Conv1D

    for kind in (torch.nn.Linear, Conv1D, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                 torch.nn.MultiheadAttention):
        if isinstance(module, kind):
            return kind.__name__
    return type(module).__name__


QLORA_REFUSED = {
    "MambaMixer": "its Mamba mixers multiply by dt_proj's weight directly (transformers' MambaMixer has no path for "
                  "a quantized model, as Jamba's and Falcon-Mamba's have), and bitsandbytes packs that weight into "
                  "4-bit bytes",
    "Gemma3nTextAltUp": "its AltUp modules clamp prediction_coefs' weight in place at every training step "
                        "(`weight.data.clamp_`), and bitsandbytes packs that weight into 4-bit bytes",
    "LongcatFlashTopkRouter": "its routers multiply by classifier's weight directly (`F.linear` of "
                              "`classifier.weight`), and bitsandbytes packs that weight into 4-bit bytes",
}
"""Module classes whose forward reads a quantized Linear's weight as a tensor, so that a 4-bit run fails at its
first forward (and the simulation with it), by class name: the reason, for `--peft qlora`'s refusal. Guarded by
tests/unit/test_estimate.py (each still reads the weight, and fails in the simulation without the refusal)."""

POSITIVE = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "max_position_embeddings")
"""Model dimensions that must be whole numbers from 1 to 2**31 - 1 (beyond, tensor sizes overflow) where a config
sets them, under the config class's names for them (`attribute_map`: GPT-2's n_layer is num_hidden_layers)."""
PER_LAYER = ("intermediate_size",)
"""Those a config may give per layer, as a list (Gemma-3n's FFN widths)."""


def _global(hf: Any, name: str) -> Any:
    """A config's model-wide value of `name`, or None where it has none: newer transformers raise on reading a
    per-layer attribute of a heterogeneous config (`AmbiguousGlobalPerLayerAttributeError`) instead of
    returning one layer's value."""
    try:
        return getattr(hf, name, None)
    except Exception:
        return None


def causal_config(config: Any, name: str) -> dict[str, Any]:
    """`config` (a config.json's contents) if it describes a causal LM that the installed transformers builds
    with `AutoModelForCausalLM.from_config`, read through its `text_config` where that class is built from it
    (Llama-4: `Llama4ForCausalLM` takes the `Llama4TextConfig`), as `from_config` itself does; kept whole where
    the text config's type has no causal-LM class of its own (Emu3, Mllama: `ModelSpec.text_config`). Otherwise one
    SetupError naming `--model`, the file and the config class: not a JSON object, no or an unknown
    `model_type`, a config transformers refuses, an encoder (BERT without `is_decoder`), a sequence-to-
    sequence or vision model, a multimodal model built whole, a dimension that is not a positive number."""
    from transformers import CONFIG_MAPPING, __version__

    where = f"--model: {name}"
    if not isinstance(config, dict):
        kind = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(config), "a number")
        raise SetupError([f"{where} holds {kind}, not a JSON object of model fields; is it a Hugging Face config.json?"])
    model_type = config.get("model_type")
    if model_type is None:
        raise SetupError([f"--model: {name!r} has no 'model_type'; is it a Hugging Face config.json?"])
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise SetupError([f"{where}: model_type {model_type!r} is unknown to the installed transformers {__version__}; "
                          "if it is a newer architecture, upgrade it (pip install -U transformers)"])
    problems = _value_problems(config, CONFIG_MAPPING[model_type], where)
    if problems:
        raise SetupError(problems)
    hf = _hf_config(config, where)
    mapped = _causal_class(hf)
    text_class = hf.sub_configs.get("text_config")
    if mapped is not None and text_class is not None and getattr(mapped, "config_class", None) is text_class:
        text = dict(config.get("text_config") or {}, model_type=text_class.model_type)
        for key in ("dtype", "torch_dtype", "quantization_config"):
            if key in config and key not in text:
                text[key] = config[key]
        if _causal_class(_hf_config(text, f"{where} (its text_config)")) is not None:
            return causal_config(text, f"{name} (its text_config)")
        # Emu3, Mllama: the text config's type has no causal-LM class of its own; AutoModelForCausalLM builds
        # the text model from the whole config (`from_config` hands it `get_text_config()`), so it stays whole
        # and its sizes are read through `ModelSpec.text_config`
        problems = _value_problems(text, text_class, f"{where} (its text_config)")
        if problems:
            raise SetupError(problems)
        return config
    cls = type(hf).__name__
    text_type = getattr(hf.get_text_config(), "model_type", None) if text_class is not None else None
    if mapped is None:
        hint = (f"; its text model may be: save its text_config as a config.json with model_type {text_type!r}"
                if text_type else "")
        raise SetupError([f"{where}: {cls} is not a causal language model (AutoModelForCausalLM has no class for "
                          f"it in transformers {__version__}){hint}"])
    if text_class is not None:
        raise SetupError([f"{where}: AutoModelForCausalLM builds {mapped.__name__} from {cls}, a multimodal model "
                          "whose vision parts trainmem does not model; for the text model alone, save its "
                          f"text_config as a config.json with model_type {text_type!r}"])
    heads, groups = _global(hf, "num_attention_heads"), _global(hf, "num_key_value_heads")
    if isinstance(heads, int) and isinstance(groups, int) and groups > 0 and heads % groups:
        raise SetupError([f"{where}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                          f"({groups}): each key/value head serves a whole number of query heads"])
    if _needs_is_decoder(mapped) and getattr(hf, "is_decoder", False) is not True:
        raise SetupError([f"{where}: {cls} is an encoder; {mapped.__name__} trains it as a causal language model "
                          "only with \"is_decoder\": true in the config: set it, or pick a decoder model"])
    return config


def _value_problems(config: dict[str, Any], config_class: type, where: str) -> list[str]:
    """Dimensions that are not whole numbers in range (`POSITIVE`, a per-layer list element by element: Gemma-3n's
    `intermediate_size`) and dropouts that are not probabilities, under the config class's names for them."""
    problems = []
    names = config_class.attribute_map
    for attr in POSITIVE:  # before transformers divides by one of them
        key = names.get(attr, attr)
        value = config.get(key)
        values = value if attr in PER_LAYER and isinstance(value, list) and value else [value]
        if value is not None and any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31
                                     for v in values):
            problems.append(f"{where}: {key} must be a whole number from 1 to 2**31 - 1, got {value!r}")
    for key, value in config.items():  # a dropout the model cannot apply fails at its first forward
        if (("dropout" in key or key.endswith("pdrop")) and isinstance(value, (int, float))
                and not isinstance(value, bool) and not 0 <= value <= 1):
            problems.append(f"{where}: {key} must be a probability in [0, 1], got {value!r}")
    return problems


def _hf_config(config: dict[str, Any], where: str) -> Any:
    """The transformers config object of `config`, or a SetupError with transformers' reason on one line."""
    from transformers import CONFIG_MAPPING, __version__

    cls = CONFIG_MAPPING[config["model_type"]]
    try:
        return cls(**{k: v for k, v in config.items() if k != "model_type"})
    except Exception as e:  # transformers' strict fields raise several types, each with its own message
        reason = " ".join(str(e).split()) or type(e).__name__
        raise SetupError([f"{where}: transformers {__version__} refuses it as a {cls.__name__}: {reason}"]) from None


def _causal_class(hf: Any) -> type | None:
    """The class `AutoModelForCausalLM.from_config` builds for this config object, None where it has none."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(hf)]
    except KeyError:
        return None


def _needs_is_decoder(model_class: type) -> bool:
    """Whether this causal-LM class is an encoder's LM head that works as a decoder only when the config says
    `is_decoder` (BertLMHeadModel and its kin warn or assert on it in `__init__`; BART's sets it itself)."""
    import inspect

    try:
        source = inspect.getsource(model_class.__init__)
    except (OSError, TypeError):
        return False
    return "not config.is_decoder" in source or "assert config.is_decoder" in source


_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def special_floats(obj: Any) -> Any:
    """A config.json's values as transformers reads them: since 5.x `save_pretrained` writes inf and nan as
    `{"__float__": "Infinity"}` (configuration_utils.py `_encode_special_floats`) and `from_pretrained` decodes
    them (`_decode_special_floats`); Falcon-H1's, Bamba's and Mamba-2's `time_step_limit` is `[0.0, inf]`.
    Older files hold a bare `Infinity`, which `json.loads` already reads."""
    if isinstance(obj, dict):
        if set(obj) == {"__float__"} and obj["__float__"] in _FLOAT_TAGS:
            return _FLOAT_TAGS[obj["__float__"]]
        return {k: special_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [special_floats(v) for v in obj]
    return obj


def split_revision(model_id: str) -> tuple[str, str | None]:
    """`org/name@rev` -> (`org/name`, `rev`); no `@` -> revision None (the default branch)."""
    repo, _, revision = model_id.partition("@")
    return repo, revision or None
