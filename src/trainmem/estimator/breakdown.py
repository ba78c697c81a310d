"""The estimator's answer: a frozen breakdown in bytes, with the same `memory` keys as a measurement,
and a verdict for a card judged on what really causes an OOM (reserved + context against capacity)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainmem.hardware.gpus import CATALOG, GPU, find_gpu
from trainmem.result import Result

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


UNQUANTIZED_ADVICE = ("weights: most are layers bitsandbytes does not quantize, kept in fp32 under QLoRA; "
                      "--peft lora in bf16 holds them in half the bytes, or shard it (--gpus N --shard fsdp)")
"""Advice where QLoRA's weights are mostly unquantized (fused expert weights, Linear subclasses)."""


def advice(cut: str, peft: str, unquantized: bool = False) -> str:
    if cut == "weights" and peft == "qlora" and unquantized:
        return UNQUANTIZED_ADVICE
    already = peft == "qlora" or (peft == "lora" and cut != "weights")
    return ADAPTERS_ADVICE[cut] if already and cut in ADAPTERS_ADVICE else ADVICE[cut]


def level_of(need: int, card: GPU, margin: float) -> str:
    """`fits` within the budget (capacity less the margin), `tight` within the capacity, else `no`."""
    return "fits" if need <= card.budget(margin) else "tight" if need <= card.capacity else "no"


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
    time: dict[str, Any] | None = None
    """Predicted step time on the modelled card (`timing.StepTime.to_dict`): step_s, tokens_per_s, mfu."""

    @property
    def peak(self) -> int:
        return self.memory["peak_allocated"]

    def verdict(self, gpu: str | GPU, margin: float = 0.02) -> dict[str, Any]:
        """Judged on what causes an OOM: need = peak reserved + the card's memory outside the allocator.
        `level`: `fits` when need leaves `margin` (a fraction of capacity) free, `tight` when it fits the
        capacity with less than that free (fragmentation, another process or a longer batch can tip it
        over), `no` beyond the capacity. `fits` is `level == "fits"`, as before levels existed. Where
        the estimate also holds the other method's reserved bytes, `methods` gives both levels and
        `disagree` says whether they differ."""
        card = gpu if isinstance(gpu, GPU) else find_gpu(gpu)
        if card is None:
            raise ValueError(f"unknown GPU {gpu!r}")
        overhead = card.overhead(self.setup.get("attention", "sdpa"), self.setup.get("precision", "fp16"),
                                 self.setup.get("peft", "none"))
        need = self.memory["peak_reserved"] + overhead
        headroom = card.budget(margin) - need
        level = level_of(need, card, margin)
        parts = {k: self.memory[k] for k in ("weights", "gradients", "optimizer", "activations", "other")}
        cut = max(parts, key=parts.get)  # type: ignore[arg-type]
        # `runtime`: the card whose cuBLAS workspace and SDPA kernel the estimate modelled (the H200's without
        # --gpu); where it is not `gpu`, the reserved bytes are that card's, judged against this one
        modelled = find_gpu(self.setup["gpu"]) if self.setup.get("gpu") else None
        out = {"gpu": card.name, "fits": level == "fits", "level": level, "headroom": headroom, "need": need,
               "capacity": card.capacity, "cut_first": cut, "advice": advice(cut, self.setup.get("peft", "none"),
                                                                  "unquantized_weights" in self.terms),
               "margin": margin, "runtime": (modelled or CATALOG["H200"]).name}
        if "analytic_reserved" in self.terms and self.method == "simulate":
            other = level_of(self.terms["analytic_reserved"] + overhead, card, margin)
            out["methods"] = {"simulate": level, "analytic": other}
            out["disagree"] = other != level
        return out

    def disagreement(self, gpu: str | GPU, margin: float = 0.02) -> str | None:
        """A sentence where simulate and analytic put this setup at different levels on `gpu`."""
        v = self.verdict(gpu, margin)
        if not v.get("disagree"):
            return None
        other = self.terms["analytic_reserved"]
        return (f"the methods disagree on the {v['gpu']}: simulate says {v['methods']['simulate']} "
                f"({self.memory['peak_reserved'] / 2**30:.2f} GiB reserved), analytic says "
                f"{v['methods']['analytic']} ({other / 2**30:.2f} GiB reserved); simulate replays this step's "
                "allocations, analytic takes the median reserved/allocated ratio")

    def fits(self, gpu: str | GPU, margin: float = 0.02) -> bool:
        return bool(self.verdict(gpu, margin)["fits"])

    def to_result(self, gpu: str | None = None, margin: float = 0.02) -> Result:
        """The same result object as a measurement, so rows of both sit side by side in one file."""
        notes = list(self.notes)
        said = self.disagreement(gpu, margin) if gpu else None
        if said:
            notes.append(said)
        return Result(kind="estimate", status="ok", setup=self.setup, model=self.model, memory=dict(self.memory),
                      model_states=dict(self.model_states),
                      effective_batch=self.setup["batch_size"] * self.setup["grad_accum"] * self.setup["gpus"],
                      peak_phase=self.peak_phase, notes=notes, method=self.method, env=dict(self.env),
                      terms=dict(self.terms), verdict=self.verdict(gpu, margin) if gpu else None,
                      time=dict(self.time or {}))
