"""A setup from its sources, in order: TrainSetup's defaults, a TrainingArguments JSON, a YAML file, given values.

Given values are what the command line's flags hold (text) or what a sweep point or a YAML grid holds
(typed); each is converted to its field's type here, so that every bad value is reported at once, with
the problems of the setup itself, in one SetupError. The CLI (`trainmem.cli.options`) and the sweep
(`trainmem.search.sweep.resolve`) both come through `load_setup`, so a setup means the same in both.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

from trainmem.errors import SetupError

from .setup import TrainSetup, training_arguments_values
from .sft import SFT_DEFAULTS, SFT_KINDS, SFT_OVERRIDES, sft_problems, sft_values
from .presets import HUB_IDS, PRESETS
from .specs import ModelSpec

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}
BARE_BYTES_MIN = 2**20
"""The smallest size a bare number (no unit) may give, in bytes: `--memory-cap 12` means 12 GiB to whoever
types it, never 12 bytes, so a bare number below 1 MiB is refused rather than read as a byte count."""
SIZES = "12GiB, 12.5GiB, 12000MiB or 12GB"

KINDS: dict[str, str] = {
    "batch_size": "int", "grad_accum": "int", "seq_len": "int", "checkpointing": "bool", "lora_experts": "bool", "lora_r": "int",
    "lora_alpha": "int", "lora_dropout": "float", "lora_targets": "list", "lr": "float", "lr_batch": "int",
    "steps": "int", "num_samples": "int", "memory_cap": "bytes", "seed": "int", "gpus": "int", "nodes": "int", "gpus_per_node": "int", "rank": "rank",
    "gpu": "name", "model": "name",
}
"""How a given value becomes its field's type (fields not named here are text)."""

OPTIONAL = {f.name for f in fields(TrainSetup) if f.default is None} | {"model"}
"""Fields whose default is None: a file may set them to null (the default); any other field needs a value."""

_EXPECTED = {"int": "a whole number", "float": "a finite number", "bool": "true or false", "list":
             "a list of module names", "rank": "a rank number or all", "name": "a name", "text": "text"}


def parse_bytes(text: str) -> int:
    """'12GiB', '12.5GiB', '300MB', '12884901888' -> bytes. Units: B, KB, MB, GB, TB (powers of 1000) and KiB,
    MiB, GiB, TiB (powers of 1024), any case. A bare number is bytes, and must be at least 1 MiB
    (`BARE_BYTES_MIN`): below that it is a size whose unit was left out, a ValueError saying so."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size like {SIZES}")
    if not m.group(2):
        return bare_bytes(float(m.group(1)), m.group(1))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def bare_bytes(number: float, shown: str) -> int:
    """A number given without a unit, as bytes; a ValueError below 1 MiB, where the unit was surely left out."""
    if number < BARE_BYTES_MIN:
        example = f"{shown}GiB" if 0 < number <= 1024 else f"{shown}MiB" if number > 1024 else "12GiB"
        raise ValueError(f"{shown} has no unit, and as bytes it is less than 1 MiB; write the unit, e.g. {example}")
    return int(number)


def convert(kind: str, value: Any) -> Any:
    """A given value as the type `kind` names; ValueError (its message says what was expected) if it is not one.

    Text (a flag, or a string in a file) is parsed as a flag is. A typed value (YAML, JSON, Python) must
    already be of the kind: a bool is no number (`batch_size: true`), a float no whole number (`4.7`), a
    number or `"no"` no bool. An int where a name is expected becomes its digits: YAML reads `gpu: 4090`
    as a number, and the card meant is the 4090. Floats must be finite (`nan`, `inf` name no setting).
    """
    def wrong() -> ValueError:
        hint = (" (YAML reads yes/no/on/off as true/false: quote the word)"
                if isinstance(value, bool) and kind in ("text", "name") else "")
        return ValueError(f"expected {_EXPECTED.get(kind, 'text')}, got {_shown(value)}{hint}")

    text = value.strip() if isinstance(value, str) else None
    if kind == "int":
        if text is not None:
            try:
                return int(text)
            except ValueError:
                raise wrong() from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise wrong()
    if kind == "float":
        try:
            number = float(text) if text is not None else None
        except ValueError:
            number = None
        if number is None and isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        if number is None or not math.isfinite(number):
            raise wrong()
        return number
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise wrong()
    if kind == "rank":
        if text is not None:
            return int(text) if text.lstrip("-").isdigit() else text
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise wrong()
    if kind == "list":
        items = [t.strip() for t in text.split(",")] if text is not None else None
        if items is not None and len(items) > 1 and not all(items):  # '2,,4' and '2,4,': an item left out
            raise ValueError(f"{value!r} has an empty item; put one module name between commas, e.g. "
                             f"{','.join(t for t in items if t) or 'q_proj,v_proj'}")
        if items is not None:
            return [t for t in items if t]
        if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
            return [t.strip() for t in value]
        raise wrong()
    if kind == "bytes":  # a number in a file is a bare number, as a flag's digits are
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return bare_bytes(value, _shown(value))
        if text is None:
            raise ValueError(f"{_shown(value)} is not a size like {SIZES}")
        return parse_bytes(text)
    if kind == "name" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if text is None:
        raise wrong()
    return value


def _shown(value: Any) -> str:
    """A value as the user wrote it in a file: null, true/false, numbers bare, text quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


TRAINING_ARGUMENTS = {"per_device_train_batch_size": "int", "gradient_accumulation_steps": "int",
                      "gradient_checkpointing": "bool", "bf16": "bool", "fp16": "bool", "optim": "text",
                      "learning_rate": "float", "seed": "int", "max_steps": "int", **SFT_KINDS}
"""The TrainingArguments and SFTConfig fields a setup is read from, and their kinds."""


def read_training_arguments(path: str) -> dict[str, Any]:
    """TrainSetup fields from a file of TrainingArguments fields, or of TRL SFTConfig fields (any field SFTConfig
    adds makes it one: `trainmem.config.sft`); missing ones take Trainer's (or SFTConfig's) defaults.

    JSON (`args.to_json_string()`) or, for a .yaml/.yml file, YAML as a recipe holds it. The values are read
    into a plain namespace rather than a `TrainingArguments`, whose checks would fail for settings this machine
    cannot run (bf16 without a GPU) although they can be estimated, and TRL need not be installed.
    Raises SetupError naming every bad field, OSError/ValueError for a file that cannot be read.
    """
    import json
    from types import SimpleNamespace

    import yaml
    from transformers import TrainingArguments

    with open(path, encoding="utf-8") as f:
        try:
            loaded = yaml.safe_load(f) if Path(path).suffix.lower() in (".yaml", ".yml") else json.load(f)
        except yaml.YAMLError as e:
            raise ValueError(f"not YAML: {e}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"the top level must be an object of TrainingArguments fields, not {_json_kind(loaded)}")
    defaults = {f.name: f.default for f in fields(TrainingArguments)}
    sft = any(k in SFT_DEFAULTS for k in loaded)
    if sft:
        defaults.update(SFT_DEFAULTS, **SFT_OVERRIDES)
    unknown = sorted(set(map(str, loaded)) - set(defaults) - set(SFT_DEFAULTS))
    kind = "TrainingArguments or SFTConfig" if sft else "TrainingArguments"
    problems = [f"--training-args: unknown {kind} field {k!r} in {path}" for k in unknown]
    for name, kind in TRAINING_ARGUMENTS.items():
        if name in loaded and not (name == "max_length" and loaded[name] is None):
            try:
                loaded[name] = convert(kind, loaded[name])
            except ValueError as e:
                problems.append(f"--training-args: {name} in {path}: {e}")
    if problems:
        raise SetupError(problems)
    args = {**defaults, **loaded}
    if args["bf16"] is None:  # SFTConfig's default: bf16 unless fp16
        args["bf16"] = not args["fp16"]
    if not sft:
        return training_arguments_values(SimpleNamespace(**args))
    problems = sft_problems(args, path)
    if problems:
        raise SetupError(problems)
    return {**training_arguments_values(SimpleNamespace(**args)), **sft_values(args)}


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def default_model() -> str:
    """The default model of `trainmem run`: polyglot-ko-1.3b where it can run (a CUDA machine), the tiny
    preset on the CPU."""
    import torch

    return "EleutherAI/polyglot-ko-1.3b" if torch.cuda.is_available() else "tiny-gpt-neox"


def _read_yaml(path: str, problems: list[str], where: dict[str, str]) -> dict[str, Any]:
    """The setup fields of a YAML file; each problem (and, in `where`, each field's origin) names the file."""
    import yaml

    known = {f.name for f in fields(TrainSetup)} | {"model"}
    values: dict[str, Any] = {}
    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ValueError(f"the top level must be a mapping of setup fields, not {_json_kind(loaded)}")
        for k, v in loaded.items():
            key = str(k).replace("-", "_")
            if key in known:
                values[key] = v
                where[key] = f"--config: {k} in {path}"
            else:
                problems.append(f"--config: unknown field {str(k)!r} in {path}")
    except (OSError, ValueError, yaml.YAMLError) as e:
        problems.append(f"--config: cannot read {path!r}: {e}")
    return values


LORA_VALUES = ("lora_r", "lora_alpha", "lora_dropout")
"""LoRA's numbers, which have defaults: one given with `--peft none` would be silently unused (`lora_targets` and
`lora_experts`, whose defaults say "not given", are `TrainSetup.problems`' own)."""


def lora_without_peft(name: str, origin: str) -> str:
    """The problem of a LoRA value given (at `origin`: its flag, or where in a file) to a setup with `--peft none`."""
    flag = "--" + name.replace("_", "-")
    drop = flag if origin == flag else f"{name} from the file"
    return f"{origin}: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop {drop}"


NO_MODEL = ("--model: which model? a preset (e.g. llama-3.2-1b, qwen2.5-0.5b, tiny-llama), a config.json, a local "
            "model folder or a hub id (org/name), e.g. --model llama-3.2-1b")


def load_setup(model: str | None = None, values: dict[str, Any] | None = None, config: str | None = None,
               training_args: str | None = None, problems: list[str] | None = None,
               default: Callable[[], str] | None = default_model,
               peft_searched: bool = False) -> tuple[ModelSpec, TrainSetup]:
    """The model and the validated setup its sources describe; raises one SetupError with every problem.

    Args:
        model: a preset, config.json, folder or hub id; else `model` from `config`; else `default()`.
        values: field -> value (text or typed), over the files: the flags given, a sweep point's values.
        config: a YAML file of setup fields (and `model`), over `training_args`.
        training_args: a JSON file of TrainingArguments fields (`args.to_json_string()`), or a JSON or YAML
            file of TRL SFTConfig fields (`read_training_arguments`).
        problems: problems already found by the caller (its own options), reported with these.
        default: the model when none is given (`default_model`); None makes a missing model a problem.
        peft_searched: the caller searches over `peft` (`plan --allow peft`), so a LoRA value given with
            `--peft none` is for its LoRA candidates; otherwise it is a problem, as the value would go unused.
    """
    problems = list(problems or [])
    for flag, path in (("--training-args", training_args), ("--config", config)):
        if path is not None and not str(path).strip():
            problems.append(f"{flag}: an empty file name; pass a file or leave the flag out")
    merged: dict[str, Any] = {}
    packed = False
    where: dict[str, str] = {}  # field -> how a problem names it where it is not its flag
    if training_args:
        try:
            merged.update(read_training_arguments(training_args))
            packed = merged.get("data_mode") == "pack"  # SFTConfig's packing
        except SetupError as e:
            problems += e.problems
        except (OSError, ValueError) as e:
            problems.append(f"--training-args: cannot read {training_args!r}: {e}")
    if config:
        merged.update(_read_yaml(config, problems, where))
    given = {k: v for k, v in (values or {}).items() if v is not None}
    mode_set = "data_mode" in given or "data_mode" in where  # by a flag or the YAML file, over SFTConfig's packing
    if packed and not mode_set and given.get("data", merged.get("data")) is None:
        del merged["data_mode"]  # dummy rows are full rows of max_length tokens, as packed rows are
    merged.update(given)
    for name in given:
        where.pop(name, None)
    if model is not None:
        merged["model"], where["model"] = model, "--model"
    peft_given = "peft" in merged
    for name in list(merged):
        origin = where.get(name, "--" + name.replace("_", "-"))
        if merged[name] is None and name in OPTIONAL:
            del merged[name]
        elif merged[name] is None:
            problems.append(f"{origin}: null, where a value is needed; leave the field out for the default "
                            f"({getattr(TrainSetup, name)!r})")
            del merged[name]
        else:
            try:
                merged[name] = convert(KINDS.get(name, "text"), merged[name])
            except ValueError as e:
                problems.append(f"{origin}: {e}")
                del merged[name]
    if "gpus" not in merged and isinstance(merged.get("gpus_per_node"), int) and merged["gpus_per_node"] > 0:
        # --gpus is the world size: nodes x GPUs a node
        merged["gpus"] = merged["gpus_per_node"] * (merged["nodes"] if isinstance(merged.get("nodes"), int) else 1)
    unread = peft_given and "peft" not in merged  # a bad --peft is its own problem: say nothing of LoRA's values
    if not peft_searched and not unread and merged.get("peft", TrainSetup.peft) == "none":
        problems += [lora_without_peft(n, where.get(n, "--" + n.replace("_", "-"))) for n in LORA_VALUES if n in merged]
    name = merged.pop("model", None)
    if name is not None and not name.strip():
        problems.append("--model: an empty name; " + NO_MODEL.split("? ", 1)[1])
    elif name is None and default is None:
        problems.append(NO_MODEL)
    # the setup's own problems are answered before the model is resolved (which imports transformers and may
    # fetch a config.json), where the model is not in question: a mistyped value costs a fraction of a second
    alone = TrainSetup(**merged).problems()
    if (problems or alone) and (name is None and default is not None or name in PRESETS or name in HUB_IDS
                                or name is not None and Path(name).exists()):
        raise SetupError(problems + alone)
    spec = None
    if name is not None and name.strip() or name is None and default is not None:
        try:
            spec = ModelSpec.resolve(name if name is not None else default())  # type: ignore[misc]
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


__all__ = ["KINDS", "parse_bytes", "bare_bytes", "convert", "read_training_arguments", "default_model", "load_setup",
           "NO_MODEL", "LORA_VALUES", "lora_without_peft"]
