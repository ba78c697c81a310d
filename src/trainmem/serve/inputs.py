"""What the page sends, read as the CLI reads flags: every problem at once, each naming its field, one line each.

The page's form arrives as text fields named like `trainmem estimate`'s flags (`batch_size`, `seq_len`,
`peft`, ...). `read_query` turns them into a model reference and a validated `TrainSetup`; the setup's own
rules are `TrainSetup.validate`'s, so a setup the page accepts is one `trainmem estimate` accepts. On top of
those, the server bounds what one request may cost (`BOUNDS`, `MAX_LAYERS`) and what it reads: a model is a
preset, a hub id (its config.json only, never weights) or an uploaded config.json kept in memory, never a local
path, and a config that names custom code (`auto_map`: `trust_remote_code`) is refused, because nothing
from a request may run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .. import PRESETS, ModelSpec, SetupError, TrainSetup, find_gpu
from ..config.optimizers import OPTIMIZERS

BOUNDS = {"batch_size": 1024, "grad_accum": 64, "seq_len": 131072, "lora_r": 1024, "gpus": 64, "nodes": 64,
          "gpus_per_node": 64, "target": 4096}
"""The largest value a request may ask for: the simulate method steps through every micro-batch of a
step (3 x accumulation forward/backward passes), so these keep one request within the job time limit."""
MAX_LAYERS = 160
"""Decoder layers a config may have (the largest presets have 40; Llama-3.1-405B has 126)."""
MAX_CONFIG_BYTES = 256 * 1024
"""A config.json is a few KB; 256 KiB leaves room for long `id2label` maps."""
MAX_UPLOADS = 64
"""Uploaded configs kept in memory (oldest dropped first)."""
CHOICES = {"peft": ("none", "lora", "qlora"),
           "precision": ("auto", "fp32", "fp16", "bf16", "amp-bf16", "amp-fp16"),
           "optimizer": tuple(OPTIMIZERS),
           "shard": ("none", "ddp", "zero1", "zero2", "zero3", "fsdp"),
           "offload": ("none", "optimizer", "params")}
INTS = ("batch_size", "grad_accum", "seq_len", "lora_r", "gpus", "nodes", "gpus_per_node")
OPTIONAL = ("gpus_per_node",)
"""Whole-number fields that may be left empty (`TrainSetup`'s None: GPUs per node is then GPUs / nodes)."""
DEFAULTS = {"model": "polyglot-ko-1.3b", "batch_size": "16", "grad_accum": "1", "seq_len": "256", "peft": "none",
            "lora_r": "8", "lora_targets": "", "precision": "fp16", "optimizer": "adamw", "checkpointing": "",
            "gpus": "1", "shard": "none", "offload": "none", "nodes": "1", "gpus_per_node": "", "card": "T4"}
"""The page's first setup: the seed chapter's batch-16 run (the one a T4 cannot hold)."""
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}(@[\w.-]{1,64})?")
CUSTOM_CODE = ("auto_map", "trust_remote_code")

_uploads: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()


@dataclass(frozen=True)
class Query:
    """One validated request: the model, the setup (validated for it) and the card the page is looking at."""

    model: str
    """What the form said: a preset, a hub id, or `upload:<digest>`."""
    spec: ModelSpec
    setup: TrainSetup
    card: str

    @property
    def key(self) -> str:
        """The cache key of the setup on this model (the card is not part of it: every card is answered)."""
        return json.dumps([self.model, self.setup.to_dict()], sort_keys=True)


def check_config(config: Any, where: str) -> list[str]:
    """Why a config cannot be estimated here: not an object, no known `model_type`, custom code, too deep."""
    from transformers import CONFIG_MAPPING

    if not isinstance(config, dict):
        return [f"{where}: expected a JSON object (a Hugging Face config.json)"]
    problems = []
    custom = [k for k in CUSTOM_CODE if k in config]
    if custom:
        problems.append(f"{where}: {', '.join(custom)} names custom modeling code (trust_remote_code); trainmem serve "
                        "runs only the architectures transformers ships and never runs code from a model")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        problems.append(f"{where}: model_type {model_type!r} is not an architecture this transformers knows")
    layers = config.get("num_hidden_layers", config.get("n_layer", 0))
    if not isinstance(layers, int) or not 0 <= layers <= MAX_LAYERS:
        problems.append(f"{where}: {layers!r} layers; trainmem serve estimates models of up to {MAX_LAYERS}")
    return problems


def add_upload(name: str, text: str) -> str:
    """Keep an uploaded config.json (parsed as JSON, checked) and return the form's model value for it."""
    where = "config.json"
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise SetupError([f"{where}: {len(text.encode()):,} bytes; a config.json here may have {MAX_CONFIG_BYTES:,}"])
    try:
        config = json.loads(text)
    except ValueError as e:
        raise SetupError([f"{where}: not JSON ({e})"]) from None
    problems = check_config(config, where)
    if problems:
        raise SetupError(problems)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    label = re.sub(r"[^\w.-]", "_", name)[:64] or "config.json"
    _uploads[digest] = (label, config)
    _uploads.move_to_end(digest)
    while len(_uploads) > MAX_UPLOADS:
        _uploads.popitem(last=False)
    return f"upload:{digest}"


def model_ref(model: str) -> tuple[str, ...]:
    """What a worker process needs to build the same spec: ('preset'|'hub', name) or ('config', label, json)."""
    if model.startswith("upload:"):
        if model[7:] not in _uploads:
            raise SetupError(model_problems(model))
        label, config = _uploads[model[7:]]
        return ("config", label, json.dumps(config))
    return ("hub" if "/" in model else "preset", model)


def resolve(ref: tuple[str, ...]) -> ModelSpec:
    """The spec of a model reference, never from a local path: a preset (or its hub id), the local Hugging Face
    cache, the Hub's config.json, or an uploaded config."""
    kind, name = ref[0], ref[1]
    if model_problems(name) and kind != "config":  # never a path, whoever asks
        raise SetupError(model_problems(name))
    if kind == "config":
        config = json.loads(ref[2])
        problems = check_config(config, "config.json")
        if problems:
            raise SetupError(problems)
        return ModelSpec(name=name, config=config, source="config")
    if kind == "preset" or name.split("@")[0] in preset_hub_ids():
        return ModelSpec.from_preset(name.split("@")[0])
    spec = ModelSpec.from_hub_cache(name) or ModelSpec.from_hub(name)
    problems = check_config(spec.config, f"--model {name}")
    if problems:
        raise SetupError(problems)
    return spec


def preset_hub_ids() -> set[str]:
    from trainmem.config.presets import HUB_IDS

    return set(HUB_IDS)


def model_problems(model: str) -> list[str]:
    if model.startswith("upload:"):
        kept = model[7:] in _uploads
        return [] if kept else ["--model: the uploaded config.json is no longer kept here; upload it again"]
    if model in PRESETS or HUB_ID.fullmatch(model):
        return []
    return [f"--model: {model!r} is neither a preset ({', '.join(p for p in PRESETS if not p.startswith('tiny-'))}) "
            "nor a hub id (org/name[@revision]); upload a config.json for anything else (local paths are not read)"]


def model_of(form: dict[str, str]) -> str:
    """The model the form names (the page's first one when none)."""
    return (form.get("model") or DEFAULTS["model"]).strip()


def setup_values(form: dict[str, str], problems: list[str]) -> dict[str, Any]:
    """The form's setup fields as TrainSetup's types, bounded; each problem named by its flag."""
    values: dict[str, Any] = {}
    for name in INTS:
        text = (form.get(name) or DEFAULTS[name]).strip()
        flag = "--" + name.replace("_", "-")
        if not text and name in OPTIONAL:
            continue
        if not re.fullmatch(r"\d{1,9}", text):
            problems.append(f"{flag}: expected a whole number, got {text!r}")
        elif int(text) > BOUNDS[name]:
            problems.append(f"{flag}: at most {BOUNDS[name]} here (trainmem serve bounds each request), got {text}")
        else:
            values[name] = int(text)
    for name, allowed in CHOICES.items():
        value = form.get(name) or DEFAULTS[name]
        if value not in allowed:
            problems.append(f"--{name}: {value[:40]!r} is not one of {', '.join(allowed)}")
        else:
            values[name] = value
    targets = [t.strip() for t in (form.get("lora_targets") or "").split(",") if t.strip()]
    if any(not re.fullmatch(r"[\w.-]{1,64}", t) for t in targets) or len(targets) > 32:
        problems.append("--lora-targets: module names (letters, digits, _ . -), comma separated, at most 32")
    elif targets and values.get("peft", "none") != "none":
        values["lora_targets"] = targets
    values["checkpointing"] = (form.get("checkpointing") or "").lower() in ("1", "on", "true", "yes")
    return values


def read_query(form: dict[str, str], specs: Any = None) -> Query:
    """The request's model, setup and card, validated; raises one SetupError with every problem.

    `specs(model) -> ModelSpec` looks a model up (the server's cache); by default it is resolved here."""
    problems: list[str] = []
    model = model_of(form)
    problems += model_problems(model)
    values = setup_values(form, problems)
    card = form.get("card") or DEFAULTS["card"]
    if find_gpu(card) is None:
        problems.append(f"--gpu: unknown card {card[:40]!r}")
    spec = None
    if not model_problems(model):
        try:
            spec = specs(model) if specs else resolve(model_ref(model))
        except SetupError as e:
            problems += e.problems
    try:  # without a spec, the rules of the setup alone (as load_setup does when the model is wrong)
        setup = TrainSetup(**values).validate(spec)
    except SetupError as e:
        problems += e.problems
    if problems:
        raise SetupError(problems)
    return Query(model, spec, setup, find_gpu(card).name)  # type: ignore[arg-type, union-attr]


__all__ = ["Query", "read_query", "add_upload", "model_ref", "resolve", "check_config", "BOUNDS", "DEFAULTS",
           "MAX_CONFIG_BYTES", "MAX_LAYERS"]
