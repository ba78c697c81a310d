"""Flags shared by the subcommands, defined once: the setup flags, `--margin`, `--estimator`, `--json`, `--out`.

Values are read as text and converted by `trainmem.config.sources.load_setup`, so that every bad flag is
reported at once instead of argparse stopping at the first one. Precedence: TrainSetup defaults, then
`--training-args FILE` (a transformers TrainingArguments as `args.to_json_string()` writes it, or a TRL SFTConfig's
fields as JSON or YAML),
then `--config FILE.yaml`, then flags given on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from trainmem.config.setup import (
    ATTENTIONS,
    ENGINES,
    ESTIMATORS,
    KERNELS,
    MAMBA_PATHS,
    OPTIMIZERS,
    PEFTS,
    PRECISIONS,
    TrainSetup,
)
from trainmem.config.sources import default_model, load_setup
from trainmem.config.specs import PRESETS, ModelSpec
from trainmem.hardware.gpus import CATALOG, GPU, find_gpu, margin_problem

# flag -> (TrainSetup field, help)
SETUP_FLAGS: dict[str, tuple[str, str]] = {
    "--batch-size": ("batch_size", "micro-batch size (default 4)"),
    "--grad-accum": ("grad_accum", "gradient accumulation steps (default 1)"),
    "--seq-len": ("seq_len", "sequence length (default 256)"),
    "--peft": ("peft", f"{'|'.join(PEFTS)} (default none)"),
    "--lora-r": ("lora_r", "LoRA rank (default 8; with --peft lora or qlora)"),
    "--lora-alpha": ("lora_alpha", "LoRA alpha (default 32; with --peft lora or qlora)"),
    "--lora-dropout": ("lora_dropout", "LoRA dropout (default 0.05; with --peft lora or qlora)"),
    "--lora-targets": ("lora_targets", "comma-separated module names (default: per architecture; with --peft lora "
                       "or qlora)"),
    "--precision": ("precision", f"{'|'.join(PRECISIONS)} (default auto: checkpoint dtype on CUDA, fp32 on CPU)"),
    "--optimizer": ("optimizer", f"{'|'.join(OPTIMIZERS)} (default adamw)"),
    "--lr": ("lr", "learning rate (default 1e-4)"),
    "--lr-batch": ("lr_batch", "the effective batch --lr was tuned for (warns when this setup's differs)"),
    "--attention": ("attention", f"{'|'.join(ATTENTIONS)} (default auto: sdpa where the model's transformers class supports it, else eager)"),
    "--kernels": ("kernels", f"{'|'.join(KERNELS)}: liger = liger-kernel's fused linear cross-entropy, RMSNorm, "
                  "SwiGLU and RoPE for llama, mistral, qwen2 and qwen3 models (default none)"),
    "--mamba-path": ("mamba_path", f"{'|'.join(MAMBA_PATHS)}: the path a Mamba mixer takes where it trains: "
                     "torch = transformers' PyTorch scan (no mamba-ssm; default), kernels = mamba-ssm and "
                     "causal-conv1d installed"),
    "--steps": ("steps", "optimizer steps (default 3; step 2 is the first steady one)"),
    "--labels": ("labels", "dummy labels: random (independent token ids, default) | copy (labels = inputs)"),
    "--num-samples": ("num_samples", "dummy samples (default 64)"),
    "--data": ("data", "local .txt or .jsonl file to train on instead of dummy data"),
    "--data-mode": ("data_mode", "pad | pack (for --data)"),
    "--device": ("device", "auto | cuda | cpu"),
    "--gpu": ("gpu", "the card to fit (T4, A100-40GB, H100-80GB, ...); run emulates it: memory capped at its usable memory, "
             "its cuBLAS workspace and SDPA kernels (the host's context and timings stay the host's)"),
    "--memory-cap": ("memory_cap", "SIZE with its unit: 12GiB, 12.5GiB, 12000MiB, 12GB (KB/MB/GB/TB are powers of "
                     "1000, KiB/MiB/GiB/TiB of 1024; a bare number is bytes and must be at least 1 MiB): run lets "
                     "the allocator reserve at most SIZE; estimate judges the setup against a card of SIZE in total "
                     "with the --gpu card's runtime figures (memory outside the allocator, kernels), else the H200's; "
                     "with --gpu too, against the smaller"),
    "--seed": ("seed", "random seed (default 0)"),
    "--gpus": ("gpus", "data-parallel GPUs (default 1; run: CPU processes over gloo with --device cpu, or one rank with --rank)"),
    "--shard": ("shard", "none|ddp|zero1|zero2|zero3|fsdp: how states spread over --gpus N (N >= 2; one GPU only "
              "with --offload); run: ddp, fsdp; estimate simulates fsdp"),
    "--nodes": ("nodes", "machines the --gpus ranks span (default 1); with --shard fsdp over several: HSDP, sharded "
                "within a node and replicated across nodes (estimate, plan)"),
    "--gpus-per-node": ("gpus_per_node", "GPUs per machine; --gpus (the world size) defaults to --nodes x this"),
    "--network": ("network", "the link between nodes, per GPU: ib-ndr (default, 400 Gb/s), ib-hdr, roce-400, roce-200"),
    "--rank": ("rank", "R|all: measure rank R (or each in turn) of the --gpus N --shard fsdp run in one "
               "process through PyTorch's fake process group (default on CUDA: rank 0)"),
    "--offload": ("offload", "none|optimizer|params: ZeRO/FSDP offload to CPU memory (params: the optimizer states too)"),
    "--engine": ("engine", f"{'|'.join(ENGINES)}: trainmem's loop, transformers.Trainer or TRL's SFTTrainer "
                 "with MemoryCallback (default loop; an SFTConfig in --training-args sets sft); estimate prices sft "
                 "with TRL's fused LM head"),
}
ALIASES = {"--grad-accum": ["--gradient-accumulation-steps"], "--checkpointing": ["--gradient-checkpointing"]}
FIELDS = [name for name, _ in SETUP_FLAGS.values()]

_NO_STEP = "it compares gradients and takes no optimizer step"
_ONE_PROCESS = "it compares one process's gradients"
_NOT_MEMORY = "it checks gradients, not memory"
_ONE_MACHINE = "it runs every rank on this machine; --nodes prices a run across machines in estimate and plan"
NOT_USED: dict[str, dict[str, str]] = {
    "run": {"nodes": _ONE_MACHINE, "gpus_per_node": _ONE_MACHINE, "network": _ONE_MACHINE},
    "estimate": {
        "rank": ("it predicts rank 0 of --shard fsdp and the fullest rank of --shard zero1|zero2; --rank picks the "
                 "rank trainmem run measures"),
        "steps": "it models the steady step, whatever the run's length",
        "seed": "random weights and data take the same memory whatever their seed",
        "labels": "the labels' values take no memory of their own",
        "num_samples": "it models one optimizer step, not a pass over the dummy data",
    },
    "max-batch": {
        "batch_size": "it searches the micro-batch; --target-batch N adds the accumulation for an effective batch",
        "memory_cap": "it fits the --gpu card, less --margin",
    },
    "plan": {
        "steps": "it estimates the steady step, and --confirm runs 8 steps",
        "memory_cap": "it fits the --gpu card, less --margin",
    },
    "verify-accumulation": {
        "batch_size": "--full-batch and --micro-batch set its batches",
        "grad_accum": "--full-batch and --micro-batch set its batches",
        "precision": "--dtype sets the weights' dtype",
        "optimizer": _NO_STEP, "lr": _NO_STEP, "lr_batch": _NO_STEP, "steps": _NO_STEP,
        "gpu": _NOT_MEMORY, "memory_cap": _NOT_MEMORY,
        "gpus": _ONE_PROCESS, "shard": _ONE_PROCESS, "rank": _ONE_PROCESS, "offload": _ONE_PROCESS,
        "nodes": _ONE_PROCESS, "gpus_per_node": _ONE_PROCESS, "network": _ONE_PROCESS,
        "engine": "it runs its own forward and backward passes",
    },
}
"""Setup flags a command takes no notice of, and why: given, each is a problem naming it (never silently unused);
hidden from the command's --help. A --config file may hold these fields: one file serves every command."""


def add_setup_arguments(p: argparse.ArgumentParser, model_required: bool = False, command: str | None = None) -> None:
    """`--model`, `--config`, `--training-args` and one flag per setup field, all read as text. `model_required`:
    the help says so (the check is `load_setup`'s, with the other problems). `command`: its `NOT_USED` flags are
    refused when given (`not_used`) and left out of its help."""
    unused = NOT_USED.get(command or "", {})
    p.set_defaults(not_used=(command, unused))
    default = ("required, or `model:` in --config" if model_required else
               "default: EleutherAI/polyglot-ko-1.3b on a GPU, tiny-gpt-neox on the CPU")
    p.add_argument("--model", default=None,
                   help=f"preset ({', '.join(PRESETS)}), config.json, local model folder, or hub id org/name[@rev] "
                        f"(its config.json is fetched, never weights; {default})")
    p.add_argument("--config", default=None, metavar="FILE.yaml", help="setup fields from a YAML file")
    p.add_argument("--training-args", default=None, metavar="FILE",
                   help="TrainingArguments fields as JSON (args.to_json_string()), or TRL SFTConfig fields as JSON "
                        "or YAML: batch, accumulation, checkpointing, bf16/fp16, optim, learning rate, seed, "
                        "max_steps, use_liger_kernel; SFTConfig's max_length and packing")
    for flag, (name, help_) in SETUP_FLAGS.items():
        p.add_argument(flag, *ALIASES.get(flag, []), default=None, metavar="X",
                       help=argparse.SUPPRESS if name in unused else help_)
    p.add_argument("--checkpointing", *ALIASES["--checkpointing"], action="store_true", default=None,
                   help="gradient checkpointing")
    p.add_argument("--lora-experts", action="store_true", default=None,
                   help="with --peft lora: also adapt a mixture of experts' fused expert weights (peft's "
                        "target_parameters; needs --lora-dropout 0)")


def add_margin(p: argparse.ArgumentParser) -> None:
    """`--margin`: the headroom kept free on the card, as text (converted by `margin`, so a bad one is reported
    with the rest)."""
    p.add_argument("--margin", default="0.02", help="headroom kept free on the card, a fraction of its capacity (default 0.02)")


def add_estimator(p: argparse.ArgumentParser, flag: str, default: str, why: str) -> None:
    """`--method` (estimate) or `--estimator` (sweep, max-batch): which estimate is made."""
    p.add_argument(flag, default=default, help=f"{'|'.join(ESTIMATORS)}{why}")


def add_output(p: argparse.ArgumentParser, what: str, out_default: str | None = None) -> None:
    """`--json` (print `what` as JSON) and `--out` (append result rows to a JSONL file)."""
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON")
    p.add_argument("--out", default=out_default, metavar="FILE.jsonl",
                   help=f"append the result rows to this file{f' (default {out_default})' if out_default else ''}")


def given_values(args: argparse.Namespace) -> dict[str, object]:
    """The setup flags given on the command line, field -> text (`checkpointing` -> True); not those the command
    does not use (`not_used` reports them)."""
    values: dict[str, object] = {name: getattr(args, name, None) for name in FIELDS}
    if getattr(args, "checkpointing", None):
        values["checkpointing"] = True
    if getattr(args, "lora_experts", None):
        values["lora_experts"] = True
    unused = getattr(args, "not_used", (None, {}))[1]
    return {k: v for k, v in values.items() if v is not None and k not in unused}


def not_used(args: argparse.Namespace, command: str | None = None, unused: dict[str, str] | None = None) -> list[str]:
    """One problem per setup flag given that the command does not use (`NOT_USED`, or `unused` for `command`)."""
    if unused is None:
        command, unused = getattr(args, "not_used", (None, {}))
    flags = {name: flag for flag, (name, _) in SETUP_FLAGS.items()}
    return [f"{flags[name]}: trainmem {command} does not use it ({why}); drop it"
            for name, why in (unused or {}).items() if getattr(args, name, None) is not None]


def margin(args: argparse.Namespace, problems: list[str]) -> float:
    """`--margin` as a fraction; a bad one is added to `problems`."""
    try:
        value = float(args.margin)
    except (TypeError, ValueError):
        value = -1.0
    if margin_problem(value):
        problems.append(f"--margin: expected a fraction in [0, 1), got {args.margin!r}")
    return value


def setup_from_args(args: argparse.Namespace, problems: list[str] | None = None,
                    default: Callable[[], str] | None = default_model,
                    peft_searched: bool = False) -> tuple[ModelSpec, TrainSetup]:
    """Spec and validated setup from parsed flags; raises one SetupError with every problem, `problems`
    (the command's own options) included. `default`: the model where neither --model nor --config names one
    (None: a problem); `args.default_model` says whether it was taken. `peft_searched`: LoRA values given with
    `--peft none` are for the LoRA setups the command searches (`load_setup`)."""
    taken: list[str] = []

    def fallback() -> str:
        taken.append(default())  # type: ignore[misc]
        return taken[-1]

    problems = [*not_used(args), *(problems or [])]
    try:
        return load_setup(args.model, given_values(args), args.config, getattr(args, "training_args", None),
                          problems, fallback if default is not None else None, peft_searched)
    finally:
        args.default_model = taken[-1] if taken else None


def verdict_card(setup: TrainSetup) -> str | GPU | None:
    """What `estimate` judges the setup against: the --gpu card; with --memory-cap, a card of that capacity with
    the --gpu card's runtime figures, else the H200's (where they were measured), the smaller where both are
    given. None: no verdict."""
    card = find_gpu(setup.gpu) if setup.gpu else None
    cap = setup.memory_cap
    if cap is None or card is not None and card.capacity <= cap:
        return card.name if card is not None else None
    from trainmem.output.render import cap_size

    return dataclasses.replace(card or CATALOG["H200"], name=f"{cap_size(cap)} cap", capacity=cap, aliases=())
