"""The estimator's answer: a frozen breakdown in bytes, with the same `memory` keys as a measurement,
and a verdict for a card judged on what really causes an OOM (reserved + context against capacity)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..gpus import GPU, find_gpu
from ..result import Result

ADVICE = {
    "activations": "activations: add --checkpointing or lower --batch-size (raise --grad-accum to keep the effective batch)",
    "optimizer": "optimizer states: --optimizer adamw-8bit, or train adapters only with --peft lora",
    "gradients": "gradients: train adapters only with --peft lora",
    "weights": "weights: --peft qlora (4-bit base weights) or a smaller model",
    "other": "temporaries: --optimizer adamw-fused (no foreach copies at the step); for large vocabularies, a smaller --batch-size",
}

ADAPTERS_ADVICE = {
    "weights": "weights: the base is already 4-bit; a smaller model, or shard it across GPUs (--gpus N --shard fsdp)",
    "gradients": "gradients: only the adapters train; a lower --lora-r or fewer --lora-targets",
    "optimizer": "optimizer states: --optimizer adamw-8bit (only the adapters have states)",
}
"""Advice under LoRA / QLoRA, where ADVICE's first suggestion is what the setup already does."""


def advice(cut: str, peft: str) -> str:
    already = peft == "qlora" or (peft == "lora" and cut != "weights")
    return ADAPTERS_ADVICE[cut] if already and cut in ADAPTERS_ADVICE else ADVICE[cut]


@dataclass(frozen=True)
class Breakdown:
    method: str
    memory: dict[str, int]
    """weights + gradients + optimizer + activations + other == peak_allocated, as in a measurement."""
    model_states: dict[str, int]
    peak_phase: str
    """`forward/backward` or `optimizer step`: where the peak happens."""
    setup: dict[str, Any]
    model: dict[str, Any]
    device_overhead: int
    """Bytes outside the allocator (context, kernels) added to reserved for `device_used`."""
    terms: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    env: dict[str, Any] = field(default_factory=dict)
    """The torch and transformers the estimate ran, and under `validated_on` those its model was measured on."""

    @property
    def peak(self) -> int:
        return self.memory["peak_allocated"]

    def verdict(self, gpu: str | GPU, margin: float = 0.02) -> dict[str, Any]:
        """Fits when reserved + the card's context stays `margin` (fraction of capacity) below capacity."""
        card = gpu if isinstance(gpu, GPU) else find_gpu(gpu)
        if card is None:
            raise ValueError(f"unknown GPU {gpu!r}")
        need = self.memory["peak_reserved"] + card.context
        headroom = card.budget(margin) - need
        parts = {k: self.memory[k] for k in ("weights", "gradients", "optimizer", "activations", "other")}
        cut = max(parts, key=parts.get)  # type: ignore[arg-type]
        return {"gpu": card.name, "fits": headroom >= 0, "headroom": headroom, "cut_first": cut,
                "advice": advice(cut, self.setup.get("peft", "none")), "margin": margin}

    def fits(self, gpu: str | GPU, margin: float = 0.02) -> bool:
        return bool(self.verdict(gpu, margin)["fits"])

    def to_result(self, gpu: str | None = None, margin: float = 0.02) -> Result:
        """The same result object as a measurement, so rows of both sit side by side in one file."""
        return Result(kind="estimate", status="ok", setup=self.setup, model=self.model, memory=dict(self.memory),
                      model_states=dict(self.model_states),
                      effective_batch=self.setup["batch_size"] * self.setup["grad_accum"] * self.setup["gpus"],
                      peak_phase=self.peak_phase, notes=list(self.notes), method=self.method, env=dict(self.env),
                      terms=dict(self.terms), verdict=self.verdict(gpu, margin) if gpu else None)
