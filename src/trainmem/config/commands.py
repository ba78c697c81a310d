"""A setup as the commands that reproduce it: `trainmem run`'s command line and transformers'
`TrainingArguments`, what `plan` prints for its winner and `--json` carries for every option. Torch-free."""

from __future__ import annotations

from .optimizers import trainer_name
from .setup import TrainSetup, is_regex


def describe(setup: TrainSetup, varied: tuple[str, ...] = ("precision", "optimizer")) -> str:
    """A setup in a few words: micro x accum, the method, checkpointing, and the fields the search varied."""
    words = [f"{setup.batch_size} x {setup.grad_accum}", "full" if setup.peft == "none" else setup.peft]
    words += ["ckpt"] if setup.checkpointing else []
    words += [str(getattr(setup, f)) for f in varied]
    return " ".join(words)


def run_command(model: str, s: TrainSetup) -> str:
    """The `trainmem run` command line of a setup (the flags that differ from the defaults, and the card)."""
    default = TrainSetup()
    parts = [f"trainmem run --model {model}", f"--batch-size {s.batch_size}", f"--grad-accum {s.grad_accum}",
             f"--seq-len {s.seq_len}", f"--precision {s.precision}", f"--optimizer {s.optimizer}", f"--peft {s.peft}"]
    if s.checkpointing:
        parts.append("--checkpointing")
    if s.peft != "none":
        for name in ("lora_r", "lora_alpha", "lora_dropout"):
            if getattr(s, name) != getattr(default, name):
                parts.append(f"--{name.replace('_', '-')} {getattr(s, name)}")
        if s.lora_targets:
            parts.append(f"--lora-targets {','.join(s.lora_targets)}")
    if s.attention not in ("auto", "sdpa"):  # sdpa: what transformers picks wherever it can
        parts.append(f"--attention {s.attention}")
    if s.gpu:
        parts.append(f"--gpu {s.gpu}")
    return " ".join(parts)


def training_arguments(s: TrainSetup) -> str:
    """The `TrainingArguments(...)` of a setup, as `TrainSetup.to_training_arguments` builds it, with what
    is not an argument (the weights' dtype, LoRA / 4-bit loading) said in a comment."""
    args = [f"per_device_train_batch_size={s.batch_size}", f"gradient_accumulation_steps={s.grad_accum}"]
    if s.checkpointing:
        args += ["gradient_checkpointing=True", 'gradient_checkpointing_kwargs={"use_reentrant": False}']
    if s.precision == "amp-bf16":
        args.append("bf16=True")
    if s.precision == "amp-fp16":
        args.append("fp16=True")
    args.append(f'optim="{trainer_name(s.optimizer)}"')
    load = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}.get(s.precision, "torch.float32")
    comment = f"# model loaded with dtype={load}"
    lora = f"LoraConfig(r={s.lora_r}, lora_alpha={s.lora_alpha}, lora_dropout={s.lora_dropout}{_targets(s)})"
    if s.peft == "lora":
        comment += f"; peft {lora}"
    if s.peft == "qlora":
        comment += ("; BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant="
                    f"True), prepare_model_for_kbit_training, {lora}")
    return f"TrainingArguments(output_dir=\"out\", {', '.join(args)})  {comment}"


def _targets(s: TrainSetup) -> str:
    """`, target_modules=...` as the run passes it: the setup's targets (trainmem's pick where peft has no
    default, or the user's); none where peft picks its own default for the model type."""
    if not s.lora_targets:
        return ""
    if s.lora_targets == ["all-linear"]:
        return ', target_modules="all-linear"'
    if is_regex(s.lora_targets):  # a string peft matches against whole module names
        return f', target_modules=r"{s.lora_targets[0]}"'
    return f", target_modules={s.lora_targets!r}"


__all__ = ["describe", "run_command", "training_arguments"]
