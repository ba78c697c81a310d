"""TRL's `SFTConfig` as a setup source, without TRL: the fields it adds to `TrainingArguments` and what each is
to memory. `sources.read_training_arguments` reads a file with any of these fields as an SFTConfig.

Each field is priced (it maps onto a TrainSetup field), has no effect on memory (it chooses text, tokens or
the loss's mask, never a tensor's shape), or changes memory in a way trainmem does not model: that one is a
problem naming the field and the setting trainmem can price. TRL 1.16's fields, defaults and post-init rules.
"""

from __future__ import annotations

from typing import Any

SFT_DEFAULTS: dict[str, Any] = {
    "max_length": 1024, "packing": False, "packing_strategy": "bfd", "padding_free": False,
    "pad_to_multiple_of": "auto", "activation_offloading": False, "model_init_kwargs": None,
    "loss_type": "nll", "completion_only_loss": None, "assistant_only_loss": False,
    "dataset_text_field": "text", "dataset_kwargs": None, "dataset_num_proc": None, "eos_token": None,
    "pad_token": None, "chat_template_path": None, "truncation_mode": "keep_start", "shuffle_dataset": False,
    "eval_packing": None, "trust_remote_code": False, "router_aux_loss_coef": None,
}
"""Every field SFTConfig adds to TrainingArguments, with its default."""

SFT_OVERRIDES: dict[str, Any] = {"gradient_checkpointing": True, "bf16": None, "learning_rate": 2e-5}
"""TrainingArguments defaults SFTConfig changes (`bf16` None becomes True unless `fp16` is set)."""

SFT_KINDS = {"max_length": "int", "packing": "bool", "padding_free": "bool", "activation_offloading": "bool",
             "use_liger_kernel": "bool"}
"""The kinds of the SFTConfig fields read into a setup (`use_liger_kernel` is TrainingArguments', read here too)."""


def sft_values(fields: dict[str, Any]) -> dict[str, Any]:
    """The TrainSetup fields an SFTConfig's own fields set (its TrainingArguments fields are read as Trainer's):
    SFTTrainer trains (`engine` sft: `run` trains with it, `estimate` prices its fused LM head), `max_length` is
    the sequence length, and `packing` the pack data mode. Without `--data` every dummy row is already
    `max_length` tokens, which is what a packed row holds, so the caller keeps `pack` only with data."""
    values: dict[str, Any] = {"engine": "sft", "seq_len": fields["max_length"]}
    if fields["packing"]:
        values["data_mode"] = "pack"
    return values


def sft_problems(fields: dict[str, Any], where: str) -> list[str]:
    """One line for each field whose value changes memory in a way trainmem does not model; `where` names the
    file ("--training-args: FIELD in FILE")."""
    out: list[str] = []

    def say(name: str, text: str) -> None:
        out.append(f"--training-args: {name} in {where}: {text}")

    if fields["max_length"] is None:
        say("max_length", "null leaves every sequence its own length, and trainmem prices one length; set "
            "max_length to your longest sample")
    if fields["padding_free"] and not fields["packing"]:
        say("padding_free", "true flattens each batch into one row for FlashAttention's varlen kernels, which "
            "trainmem does not model; set padding_free: false (padded rows of max_length) or packing: true "
            "(full packed rows, priced as --data-mode pack)")
    if fields["activation_offloading"]:
        say("activation_offloading", "true moves the activations saved for backward to CPU memory, which trainmem "
            "does not price; set it to false (the estimate then holds them on the GPU, an upper bound)")
    if fields["model_init_kwargs"]:
        say("model_init_kwargs", "trainmem builds the model itself (its dtype from --precision, its attention from "
            "--attention, 4-bit from --peft qlora); set those flags and drop model_init_kwargs")
    multiple = fields["pad_to_multiple_of"]
    length = fields["max_length"]
    if isinstance(multiple, int) and not isinstance(multiple, bool) and isinstance(length, int) and (
            multiple <= 0 or length % multiple):
        say("pad_to_multiple_of", f"{multiple} pads rows past max_length {length}, which trainmem does not price; "
            f"make max_length a multiple of it or drop pad_to_multiple_of")
    return out


__all__ = ["SFT_DEFAULTS", "SFT_OVERRIDES", "SFT_KINDS", "sft_values", "sft_problems"]
