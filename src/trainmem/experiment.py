"""The seed's entry point, `gpu_memory_experiment`, with its signature and trainmem's behaviour."""

from __future__ import annotations

from typing import Any

from .config.setup import TrainSetup, from_training_arguments
from .config.specs import ModelSpec
from .isolation.runner import run
from .result import Result


def gpu_memory_experiment(batch_size: int = 4, gradient_accumulation_steps: int = 1,
                          gradient_checkpointing: bool = False,
                          model_id: str = "EleutherAI/polyglot-ko-1.3b", peft: str | None = None,
                          training_args: Any = None, isolate: bool = True, **more: Any) -> Result:
    """Train `model_id` a few steps and measure its memory, as the seed chapter's function does.

    `peft` is None, "lora" or "qlora"; `training_args` may be a transformers `TrainingArguments`
    (its batch, accumulation, checkpointing, precision and learning rate are used); `more` takes any
    other `TrainSetup` field (seq_len, precision, optimizer, gpu, ...). Unlike the seed, the run is
    isolated in its own process, an OOM comes back as `status == "oom"`, and the loss is normalised
    by the label tokens of the whole accumulation window.
    """
    if training_args is not None:
        setup = from_training_arguments(training_args, **more)
        if peft is not None:
            setup = setup.replace(peft=peft)
    else:
        setup = TrainSetup(batch_size=batch_size, grad_accum=gradient_accumulation_steps,
                           checkpointing=gradient_checkpointing, peft=peft or "none", **more)
    return run(ModelSpec.resolve(model_id), setup, isolate=isolate)
