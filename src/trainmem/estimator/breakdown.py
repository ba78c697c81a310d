"""The estimator's answer: a frozen breakdown in bytes, with the same `memory` keys as a measurement,
and a verdict for a card judged on what really causes an OOM (reserved + context against capacity)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainmem.config.optimizers import OPTIMIZERS
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


def advice(cut: str, peft: str, unquantized: bool = False, setup: dict[str, Any] | None = None,
           phase: str | None = None, foreach_share: float = 1.0) -> str:
    """What to do about `cut`, the largest part at the peak. With the `setup` (a Breakdown's), the peak's `phase`
    and the share of `other` that foreach AdamW's step copies take, only changes that lower that part and that
    the setup does not already make (`_not_done`)."""
    if cut == "weights" and peft == "qlora" and unquantized:
        text = UNQUANTIZED_ADVICE
    else:
        already = peft == "qlora" or (peft == "lora" and cut != "weights")
        text = ADAPTERS_ADVICE[cut] if already and cut in ADAPTERS_ADVICE else ADVICE[cut]
    return text if setup is None else _not_done(cut, text, peft != "none", setup, phase, foreach_share)


def _not_done(cut: str, text: str, adapters: bool, s: dict[str, Any], phase: str | None, foreach: float) -> str:
    """`text` without the suggestions `s` already follows or that leave `cut` as it is: --checkpointing when it is
    on, a lower --batch-size at batch 1, --optimizer adamw-8bit for any optimizer but AdamW's 8 bytes a parameter
    (8-bit already, or SGD's and Adafactor's fewer), adamw-fused but for foreach AdamW at an optimizer-step peak
    whose temporaries are mostly the step's foreach copies (`foreach` >= 1/2: the two differ by those alone, a
    gradient's size, small under LoRA), a smaller batch for the logits at an optimizer-step peak (none are
    alive), sharding for sharded weights. Where nothing is left, what still lowers the part."""
    batch = s.get("batch_size", 2) > 1
    row = OPTIMIZERS.get(s.get("optimizer", "adamw"))
    adamw = row is not None and row.adam and not row.eight_bit  # AdamW's 8 bytes a parameter
    if cut == "activations":
        tips = [t for t, keep in (("add --checkpointing", not s.get("checkpointing")),
                                  ("lower --batch-size (raise --grad-accum to keep the effective batch)", batch)) if keep]
        return "activations: " + (" or ".join(tips) or "a shorter --seq-len (already checkpointed, at batch 1)")
    if cut == "optimizer" and not adamw:
        return ("optimizer states: only the adapters have states; a lower --lora-r or fewer --lora-targets" if adapters
                else "optimizer states: train adapters only with --peft lora")
    if cut == "other":
        tips = [t for t, keep in (("--optimizer adamw-fused (no foreach copies at the step)",
                                   row is not None and row.foreach and phase != "forward/backward"
                                   and foreach >= 0.5),
                                  ("for large vocabularies, a smaller --batch-size", batch and phase != "optimizer step"))
                if keep]
        if tips:
            return "temporaries: " + "; ".join(tips)
        return ("temporaries: the logits and their gradients; a shorter --seq-len" if phase == "forward/backward" else
                "temporaries: no flag of this setup lowers them (cuBLAS workspaces, the optimizer step's buffers)")
    if cut == "weights" and s.get("shard") in ("zero3", "fsdp"):  # sharded already: more GPUs, not sharding
        more = f"spread it over more than --gpus {s.get('gpus')}"
        return re.sub(r"shard it( across GPUs)? \(--gpus N --shard fsdp\)", more, text)
    return text


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
    """`forward/backward` or `optimizer step`: where the peak happens (a ZeRO-1/2 rank: also `INIT_PHASE`, the
    DeepSpeed engine's set-up)."""
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
        states = {k: self.model_states.get(k, 0) for k in ("weights", "gradients", "optimizer")}
        # the part that keeps the setup off the card: where the states alone exceed it, the largest of them (no
        # cut of activations can help), else the largest part of the peak
        among = states if sum(states.values()) + overhead > card.capacity else parts
        cut = max(among, key=among.get)  # type: ignore[arg-type]
        # foreach AdamW's step copies the (local) gradients: what adamw-fused would save of `other`
        copies = self.terms.get("optimizer_step_temporaries", self.model_states.get("gradients", 0))
        foreach = copies / parts["other"] if parts["other"] > 0 else 0.0
        # `runtime`: the card whose cuBLAS workspace and SDPA kernel the estimate modelled (the H200's without
        # --gpu); where it is not `gpu`, the reserved bytes are that card's, judged against this one
        modelled = find_gpu(self.setup["gpu"]) if self.setup.get("gpu") else None
        out = {"gpu": card.name, "fits": level == "fits", "level": level, "headroom": headroom, "need": need,
               "capacity": card.capacity, "cut_first": cut, "advice": advice(cut, self.setup.get("peft", "none"),
                                                                  "unquantized_weights" in self.terms, self.setup,
                                                                  self.peak_phase, foreach),
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
