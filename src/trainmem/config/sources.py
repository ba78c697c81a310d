"""A setup from its sources, in order: TrainSetup's defaults, a TrainingArguments JSON, a YAML file, given values.

Given values are what the command line's flags hold (text) or what a sweep point or a YAML grid holds
(typed); each is converted to its field's type here, so that every bad value is reported at once, with
the problems of the setup itself, in one SetupError. The CLI (`trainmem.cli.options`) and the sweep
(`trainmem.search.sweep.resolve`) both come through `load_setup`, so a setup means the same in both.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from trainmem.errors import SetupError

from .setup import TrainSetup, training_arguments_values
from .specs import ModelSpec

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}

KINDS: dict[str, str] = {
    "batch_size": "int", "grad_accum": "int", "seq_len": "int", "lora_r": "int", "lora_alpha": "int",
    "lora_dropout": "float", "lora_targets": "list", "lr": "float", "lr_batch": "int", "steps": "int",
    "num_samples": "int", "memory_cap": "bytes", "seed": "int", "gpus": "int", "rank": "rank",
}
"""How a given value becomes its field's type (fields not named here are text)."""


def parse_bytes(text: str) -> int:
    """'12GiB', '300MB', '4096' -> bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size like 12GiB, 500MB or 4096")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def convert(kind: str, text: Any) -> Any:
    """A given value (text or already typed) as the type `kind` names; ValueError/TypeError if it is not one."""
    if kind == "int":
        return int(text)
    if kind == "rank":
        return int(text) if str(text).strip().isdigit() else str(text).strip()
    if kind == "float":
        return float(text)
    if kind == "list":
        return [t.strip() for t in str(text).split(",") if t.strip()] if not isinstance(text, list) else text
    if kind == "bytes":
        return parse_bytes(text) if not isinstance(text, int) else text
    return text


def read_training_arguments(path: str) -> dict[str, Any]:
    """TrainSetup fields from a JSON file of TrainingArguments fields; missing ones take Trainer's defaults.

    The values are read into a plain namespace rather than a `TrainingArguments`, whose checks would
    fail for settings this machine cannot run (bf16 without a GPU) although they can be estimated.
    """
    import json
    from types import SimpleNamespace

    from transformers import TrainingArguments

    with open(path) as f:
        loaded = json.load(f)
    if not isinstance(loaded, dict):
        raise ValueError("the top level must be an object of TrainingArguments fields")
    defaults = {f.name: f.default for f in fields(TrainingArguments)}
    unknown = sorted(set(loaded) - set(defaults))
    if unknown:
        raise ValueError(f"unknown TrainingArguments field(s) {', '.join(map(repr, unknown))}")
    return training_arguments_values(SimpleNamespace(**{**defaults, **loaded}))


def default_model() -> str:
    """The seed's model where it can run (a CUDA machine); the tiny preset on the CPU."""
    import torch

    return "EleutherAI/polyglot-ko-1.3b" if torch.cuda.is_available() else "tiny-gpt-neox"


def _read_yaml(path: str, problems: list[str]) -> dict[str, Any]:
    import yaml

    known = {f.name for f in fields(TrainSetup)} | {"model"}
    values: dict[str, Any] = {}
    try:
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError("the top level must be a mapping of setup fields")
        for k, v in loaded.items():
            key = k.replace("-", "_")
            if key in known:
                values[key] = v
            else:
                problems.append(f"--config: unknown field {k!r} in {path}")
    except (OSError, ValueError, yaml.YAMLError) as e:
        problems.append(f"--config: cannot read {path!r}: {e}")
    return values


def load_setup(model: str | None = None, values: dict[str, Any] | None = None, config: str | None = None,
               training_args: str | None = None, problems: list[str] | None = None) -> tuple[ModelSpec, TrainSetup]:
    """The model and the validated setup its sources describe; raises one SetupError with every problem.

    Args:
        model: a preset, config.json, folder or hub id; else `model` from `config`; else `default_model()`.
        values: field -> value (text or typed), over the files: the flags given, a sweep point's values.
        config: a YAML file of setup fields (and `model`), over `training_args`.
        training_args: a JSON file of TrainingArguments fields (`args.to_json_string()`).
        problems: problems already found by the caller (its own options), reported with these.
    """
    problems = list(problems or [])
    merged: dict[str, Any] = {}
    if training_args:
        try:
            merged.update(read_training_arguments(training_args))
        except (OSError, ValueError) as e:
            problems.append(f"--training-args: cannot read {training_args!r}: {e}")
    if config:
        merged.update(_read_yaml(config, problems))
    merged.update({k: v for k, v in (values or {}).items() if v is not None})
    for name in list(merged):
        if name in KINDS:
            kind, flag = KINDS[name], "--" + name.replace("_", "-")
            try:
                merged[name] = convert(kind, merged[name])
            except (TypeError, ValueError) as e:
                problems.append(f"{flag}: {e}" if kind == "bytes" else f"{flag}: expected "
                                f"{'a whole number' if kind in ('int', 'rank') else 'a number'}, got {merged[name]!r}")
                del merged[name]
    model = model or merged.pop("model", None) or default_model()
    merged.pop("model", None)
    spec = None
    try:
        spec = ModelSpec.resolve(model)
    except SetupError as e:
        problems += e.problems
    setup = TrainSetup(**merged)
    try:
        setup = setup.validate(spec)
    except SetupError as e:
        problems += e.problems
    if problems:
        raise SetupError(problems)
    return spec, setup  # type: ignore[return-value]


__all__ = ["KINDS", "parse_bytes", "convert", "read_training_arguments", "default_model", "load_setup"]
