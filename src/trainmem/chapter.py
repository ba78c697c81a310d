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
    label: str
    setup: TrainSetup
    after_load_gb: float | None
    """`memory_allocated` after loading, as published."""
    at_first_step_gb: float | None
    """`memory_allocated` after the first optimizer step; None where the chapter ran out of memory."""
    optimizer_gb: float | None
    gradients_gb: float | None
    published_note: str = ""


def _s(**kw: object) -> TrainSetup:
    return TrainSetup(seq_len=256, precision="fp16", optimizer="adamw", **kw)  # type: ignore[arg-type]


RUNS: list[ChapterRun] = [
    ChapterRun("batch 4", _s(batch_size=4), 2.599, 10.586, 4.961, 2.481),
    ChapterRun("batch 8", _s(batch_size=8), 2.615, 11.113, 4.961, 2.481, "book text: 11.228"),
    ChapterRun("batch 16", _s(batch_size=16), 2.615, None, None, None, "out of memory (12.164 reached)"),
    ChapterRun("batch 4, accumulation 4", _s(batch_size=4, grad_accum=4), 2.615, 10.586, 4.961, 2.481),
    ChapterRun("batch 16, checkpointing", _s(batch_size=16, checkpointing=True), 2.615, 10.290, 4.961, 2.481),
    ChapterRun("batch 16, LoRA", _s(batch_size=16, peft="lora"), 2.618, 4.732, 0.006, 0.003),
    ChapterRun("batch 16, QLoRA", _s(batch_size=16, peft="qlora", checkpointing=True), 1.183, 1.722, 0.012,
               0.006, "after load and at first step from the book text"),
]
