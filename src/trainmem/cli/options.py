"""The setup flags shared by every subcommand that takes a setup (run, and later estimate and sweep).

Values are read as text and converted here, so that every bad flag is reported at once instead of
argparse stopping at the first one. Precedence: TrainSetup defaults, then `--training-args FILE.json`
(a transformers TrainingArguments as `args.to_json_string()` writes it), then `--config FILE.yaml`,
then flags given on the command line.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from typing import Any

from ..errors import SetupError
from ..setup import ATTENTIONS, ENGINES, OPTIMIZERS, PEFTS, PRECISIONS, TrainSetup, training_arguments_values
from ..specs import PRESETS, ModelSpec

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}

# flag -> (TrainSetup field, converter name, help)
SETUP_FLAGS: dict[str, tuple[str, str, str]] = {
    "--batch-size": ("batch_size", "int", "micro-batch size (default 4)"),
    "--grad-accum": ("grad_accum", "int", "gradient accumulation steps (default 1)"),
    "--seq-len": ("seq_len", "int", "sequence length (default 256)"),
    "--peft": ("peft", "str", f"{'|'.join(PEFTS)} (default none)"),
    "--lora-r": ("lora_r", "int", "LoRA rank (default 8)"),
    "--lora-alpha": ("lora_alpha", "int", "LoRA alpha (default 32)"),
    "--lora-dropout": ("lora_dropout", "float", "LoRA dropout (default 0.05)"),
    "--lora-targets": ("lora_targets", "list", "comma-separated module names (default: per architecture)"),
    "--precision": ("precision", "str", f"{'|'.join(PRECISIONS)} (default auto: checkpoint dtype on CUDA, fp32 on CPU)"),
    "--optimizer": ("optimizer", "str", f"{'|'.join(OPTIMIZERS)} (default adamw)"),
    "--lr": ("lr", "float", "learning rate (default 1e-4)"),
    "--lr-batch": ("lr_batch", "int", "the effective batch --lr was tuned for (warns when this setup's differs)"),
    "--attention": ("attention", "str", f"{'|'.join(ATTENTIONS)} (default auto: sdpa where the model's transformers class supports it, else eager)"),
    "--steps": ("steps", "int", "optimizer steps (default 3; step 2 is the first steady one)"),
    "--labels": ("labels", "str", "dummy labels: random (the seed) | copy"),
    "--num-samples": ("num_samples", "int", "dummy samples (default 64, as the seed)"),
    "--data": ("data", "str", "local .txt or .jsonl file to train on instead of dummy data"),
    "--data-mode": ("data_mode", "str", "pad | pack (for --data)"),
    "--device": ("device", "str", "auto | cuda | cpu"),
    "--gpu": ("gpu", "str", "cap memory to this card's usable memory (T4, A100-40GB, H100-80GB, ...)"),
    "--memory-cap": ("memory_cap", "bytes", "cap memory to this many bytes (e.g. 12GiB)"),
    "--seed": ("seed", "int", "random seed (default 0)"),
    "--gpus": ("gpus", "int", "data-parallel GPUs (default 1; run: CPU processes over gloo with --device cpu, or one rank with --rank)"),
    "--shard": ("shard", "str", "none|ddp|zero1|zero2|zero3|fsdp: how states spread over --gpus (run: ddp, fsdp; estimate simulates fsdp)"),
    "--rank": ("rank", "rank", "R|all: measure rank R (or each in turn) of the --gpus N --shard fsdp run in one "
               "process through PyTorch's fake process group (default on CUDA: rank 0)"),
    "--offload": ("offload", "str", "none|optimizer|params: ZeRO/FSDP offload to CPU memory (estimate)"),
    "--engine": ("engine", "str", f"{'|'.join(ENGINES)}: trainmem's loop or transformers.Trainer with "
                 "MemoryCallback (default loop; run only)"),
}
ALIASES = {"--grad-accum": ["--gradient-accumulation-steps"], "--checkpointing": ["--gradient-checkpointing"]}


def parse_bytes(text: str) -> int:
    """'12GiB', '300MB', '4096' -> bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size like 12GiB, 500MB or 4096")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _convert(kind: str, text: Any) -> Any:
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


def add_setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help=f"preset ({', '.join(PRESETS)}), config.json, local model folder, or hub id org/name[@rev] "
                        "(its config.json is fetched, never weights; default: EleutherAI/polyglot-ko-1.3b on a GPU, tiny-gpt-neox on the CPU)")
    p.add_argument("--config", default=None, metavar="FILE.yaml", help="setup fields from a YAML file")
    p.add_argument("--training-args", default=None, metavar="FILE.json",
                   help="TrainingArguments fields as JSON (args.to_json_string()): batch, accumulation, "
                        "checkpointing, bf16/fp16, optim, learning rate, seed, max_steps")
    for flag, (_, _, help_) in SETUP_FLAGS.items():
        p.add_argument(flag, *ALIASES.get(flag, []), default=None, metavar="X", help=help_)
    p.add_argument("--checkpointing", *ALIASES["--checkpointing"], action="store_true", default=None,
                   help="gradient checkpointing")


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
    import torch

    return "EleutherAI/polyglot-ko-1.3b" if torch.cuda.is_available() else "tiny-gpt-neox"


def setup_from_args(args: argparse.Namespace) -> tuple[ModelSpec, TrainSetup]:
    """Spec and validated setup from parsed flags; raises one SetupError with every problem."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    known = {f.name for f in fields(TrainSetup)}
    if getattr(args, "training_args", None):
        try:
            values.update(read_training_arguments(args.training_args))
        except (OSError, ValueError) as e:
            problems.append(f"--training-args: cannot read {args.training_args!r}: {e}")
    if args.config:
        import yaml

        try:
            with open(args.config) as f:
                loaded = yaml.safe_load(f) or {}
            if not isinstance(loaded, dict):
                raise ValueError("the top level must be a mapping of setup fields")
            for k, v in loaded.items():
                key = k.replace("-", "_")
                (values.__setitem__(key, v) if key in known or key == "model"
                 else problems.append(f"--config: unknown field {k!r} in {args.config}"))
        except (OSError, ValueError, yaml.YAMLError) as e:
            problems.append(f"--config: cannot read {args.config!r}: {e}")
    by_field = {name: (flag, kind) for flag, (name, kind, _) in SETUP_FLAGS.items()}
    for name, _, _ in SETUP_FLAGS.values():
        given = getattr(args, name, None)
        if given is not None:
            values[name] = given
    if args.checkpointing:
        values["checkpointing"] = True
    for name in list(values):
        if name in by_field:
            flag, kind = by_field[name]
            try:
                values[name] = _convert(kind, values[name])
            except (TypeError, ValueError) as e:
                problems.append(f"{flag}: {e}" if kind == "bytes" else f"{flag}: expected {'a whole number' if kind == 'int' else 'a number'}, got {values[name]!r}")
                del values[name]
    model = args.model or values.pop("model", None) or default_model()
    values.pop("model", None)
    spec = None
    try:
        spec = ModelSpec.resolve(model)
    except SetupError as e:
        problems += e.problems
    setup = TrainSetup(**values)
    problems += setup.problems(spec)
    if problems:
        raise SetupError(problems)
    return spec, setup.resolved(spec)  # type: ignore[arg-type]
