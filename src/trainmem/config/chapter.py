"""The seed chapter's seven experiments and the numbers it published (Colab T4, transformers 4.40).

All runs: EleutherAI/polyglot-ko-1.3b, fp16 weights (`torch_dtype="auto"`), sequence 256, torch AdamW
with defaults, the seed's dummy data. QLoRA: NF4, double quantization, fp16 compute, gradient
checkpointing (peft's `prepare_model_for_kbit_training` default).
"""

from __future__ import annotations

from dataclasses import dataclass

from .setup import TrainSetup

MODEL = "polyglot-ko-1.3b"
GB = 1024**3  # the seed's "GB" is bytes / 1024**3


@dataclass(frozen=True)
class ChapterRun:
    """One of the seed chapter's runs: its setup and the figures the chapter published for it."""
    label: str
    setup: TrainSetup
    after_load_gb: float | None
    """`memory_allocated` after loading, as published."""
    at_first_step_gb: float | None
    """`memory_allocated` after the first optimizer step; None where the chapter ran out of memory."""
    optimizer_gb: float | None
    gradients_gb: float | None
    published_note: str = ""
    why: str = ""
    """Why the book's figure and trainmem's peak differ, in one sentence."""


def _s(**kw: object) -> TrainSetup:
    return TrainSetup(seq_len=256, precision="fp16", optimizer="adamw", **kw)  # type: ignore[arg-type]


READ_AFTER_STEP = ("the book prints memory_allocated after the first optimizer step, when backward's activations "
                   "are freed; trainmem reports the peak of a steady step, at the optimizer step where foreach "
                   "AdamW's temporaries come on top of weights, gradients and states")
"""Why the full fine-tuning rows differ (weights, gradients and Adam states are the same in both)."""

RUNS: list[ChapterRun] = [
    ChapterRun("batch 4", _s(batch_size=4), 2.599, 10.586, 4.961, 2.481, why=READ_AFTER_STEP),
    ChapterRun("batch 8", _s(batch_size=8), 2.615, 11.113, 4.961, 2.481, "book text: 11.228",
               why=READ_AFTER_STEP + "; on a T4 it is the tightest of the fitting runs"),
    ChapterRun("batch 16", _s(batch_size=16), 2.615, None, None, None, "out of memory (12.164 reached)",
               why="the book ran out of memory with 12.164 GiB allocated, in forward/backward; trainmem's peak is "
                   "the whole step's, which would need more than the T4 has"),
    ChapterRun("batch 4, accumulation 4", _s(batch_size=4, grad_accum=4), 2.615, 10.586, 4.961, 2.481,
               why=READ_AFTER_STEP + "; with accumulation the gradients stay resident through later micro-batches"),
    ChapterRun("batch 16, checkpointing", _s(batch_size=16, checkpointing=True), 2.615, 10.290, 4.961, 2.481,
               why=READ_AFTER_STEP + "; checkpointing leaves only layer inputs, so the step's peak decides"),
    ChapterRun("batch 16, LoRA", _s(batch_size=16, peft="lora"), 2.618, 4.732, 0.006, 0.003,
               why="the book reads after the step, when batch 16's activations are gone; trainmem's peak is in "
                   "forward/backward, where they are all alive; peft now keeps the adapters in fp32, so their states are twice the book's"),
    ChapterRun("batch 16, QLoRA", _s(batch_size=16, peft="qlora", checkpointing=True), 1.183, 1.722, 0.012,
               0.006, "after load and at first step from the book text",
               why="the book's QLoRA cell started with 0.945 GB left allocated by an earlier cell, and reads after "
                   "the step; trainmem measures a fresh process at its peak, in backward"),
]


def find_run(setup: dict[str, object]) -> ChapterRun | None:
    """The chapter run a result row's setup describes (the fields that tell the seven apart), if any."""
    for run in RUNS:
        ours = run.setup.to_dict()
        if all(setup.get(k) == ours[k] for k in ("batch_size", "grad_accum", "seq_len", "checkpointing", "peft",
                                                  "precision", "optimizer")):
            return run
    return None
