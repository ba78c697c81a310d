"""Advice that is checked: each change the verdict suggests for a setup that does not fit, estimated with the same
method before it is shown, with what it then needs; where no single change fits, all of them together.

Example: llama-3.2-1b LoRA at batch 8 x 1024 tokens on an A10G needs 28.7 GiB; the check says
`--checkpointing: needs 9.6 GiB, fits` and `--batch-size 4 --grad-accum 2: needs 15.8 GiB, fits`.

The changes are the ones that lower the part to cut first and that the setup does not already make: for
activations, checkpointing and half the micro-batch at twice the accumulation (the same effective batch); for
optimizer states, 8-bit AdamW (for a full-precision Adam) and LoRA; for gradients, LoRA; for weights, QLoRA; for
temporaries, fused AdamW (for foreach AdamW) and half the micro-batch. Each check is one more
estimate of the setup, as long as the first (a few seconds for a small model, half a minute for a large mixture of
experts), except where the changed setup's weights, gradients and optimizer states alone exceed the card
(`states_floor`): that is answered from the model's inventory, as `needs over X GiB ... no`. The checks that need
an estimate run at once, one forked process each, where there are several and more than one core. A change the
setup refuses (QLoRA on a model bitsandbytes cannot quantize) is left out.
"""

from __future__ import annotations

from typing import Any

from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.estimator import EstimateError, cut_steps, estimate, states_floor
from trainmem.estimator.breakdown import Breakdown
from trainmem.forked import at_once
from trainmem.hardware.cuda import MAMBA_FAMILIES
from trainmem.hardware.gpus import GPU, find_gpu

OTHER_PATH = {"torch": ("kernels", "with mamba-ssm kernels"), "kernels": ("torch", "without mamba-ssm (PyTorch path)")}


def changes(setup: TrainSetup, cut: str) -> list[tuple[str, dict[str, Any]]]:
    """(the flags, the fields they change) of each change that lowers `cut` and that `setup` does not make."""
    row = OPTIMIZERS[setup.optimizer]
    half = ([(f"--batch-size {setup.batch_size // 2} --grad-accum {setup.grad_accum * 2}",
              {"batch_size": setup.batch_size // 2, "grad_accum": setup.grad_accum * 2})]
            if setup.batch_size > 1 and setup.batch_size % 2 == 0 else [])
    out: list[tuple[str, dict[str, Any]]] = []
    if cut == "activations":
        out += [("--checkpointing", {"checkpointing": True})] if not setup.checkpointing else []
        out += half
    elif cut == "optimizer":
        out += [("--optimizer adamw-8bit", {"optimizer": "adamw-8bit"})] if row.adam and not row.eight_bit else []
        out += [("--peft lora", {"peft": "lora"})] if setup.peft == "none" else []
    elif cut == "gradients":
        out += [("--peft lora", {"peft": "lora"})] if setup.peft == "none" else []
    elif cut == "weights":
        out += [("--peft qlora", {"peft": "qlora"})] if setup.peft != "qlora" else []
    elif cut == "other":
        out += [("--optimizer adamw-fused", {"optimizer": "adamw-fused"})] if row.foreach else []
        out += half
    return out


def check(spec: ModelSpec, setup: TrainSetup, breakdown: Breakdown, card: str | GPU, margin: float,
          method: str = "auto") -> list[dict[str, Any]]:
    """Each change for the part to cut first, estimated: `{"change", "need", "level"}`; where none fits alone
    and there are several, a last row with all of them together. Empty where the setup fits."""
    verdict = breakdown.verdict(card, margin)
    if verdict["level"] == "fits":
        return []
    found = changes(setup, verdict["cut_first"])
    levels = _levels(spec, [setup.replace(**fields) for _, fields in found], card, margin, method)
    rows = [{"change": label, **level} for (label, _), level in zip(found, levels) if level is not None]
    if len(rows) > 1 and not any(r["level"] == "fits" for r in rows):
        together: dict[str, Any] = {}
        for _, fields in found:
            together.update(fields)
        level = _levels(spec, [setup.replace(**together)], card, margin, method)[0]
        if level is not None:
            rows.append({"change": " ".join(label for label, _ in found), **level})
    return rows


def _levels(spec: ModelSpec, setups: list[TrainSetup], card: str | GPU, margin: float,
            method: str) -> list[dict[str, Any] | None]:
    """What each changed setup needs and its level (None: a change the setup refuses). Where its states alone
    exceed the card (`states_floor`), that floor and `no`, marked `floor`, without estimating the step; the
    others are estimated at once (`forked.at_once`): a deep model's cut models of every change as the pieces
    (`cut_steps`), else each change's whole estimate."""
    capacity = (card if isinstance(card, GPU) else find_gpu(card)).capacity
    levels: list[dict[str, Any] | None] = []
    estimated: list[int] = []  # the changes under the card by their states: their estimates decide
    for i, setup in enumerate(setups):
        try:
            floor = states_floor(spec, setup, card)
        except (SetupError, EstimateError):
            levels.append(None)
            continue
        levels.append({"need": floor, "level": "no", "floor": True} if floor > capacity else None)
        if floor <= capacity:
            estimated.append(i)
    steps = dict(zip(estimated, cut_steps(spec, [setups[i] for i in estimated], method)))
    for i, step in steps.items():  # composed from cut models simulated at once, above: each replayed here
        if step is not None:
            levels[i] = _estimated(spec, setups[i], card, margin, method, step)
    whole = [i for i, step in steps.items() if step is None]
    for i, level in zip(whole, at_once(lambda i: _estimated(spec, setups[i], card, margin, method), whole)):
        levels[i] = level
    return levels


def _estimated(spec: ModelSpec, setup: TrainSetup, card: str | GPU, margin: float,
               method: str, step: Any = None) -> dict[str, Any] | None:
    """The changed setup's need and level from its estimate (of its simulated `step`, where that is made);
    None where the setup refuses the change."""
    try:
        v = estimate(spec, setup, method, step=step).verdict(card, margin)
    except (SetupError, EstimateError):
        return None
    return {"need": v["need"], "level": v["level"]}


def other_mamba_path(spec: ModelSpec, setup: TrainSetup, card: str | GPU | None, margin: float,
                     method: str = "auto") -> str | None:
    """For a model with Mamba mixers, the other Mamba path's figure in words (`--mamba-path`): what it needs and
    whether that fits the card, or its peak reserved without one; None for other models. It is one more
    estimate, as long as the first: the training machine's path is rarely known to whoever asks, and the two
    differ several times over in activations."""
    if spec.model_type not in MAMBA_FAMILIES:
        return None
    other, words = OTHER_PATH[setup.mamba_path]
    try:
        b = estimate(spec, setup.replace(mamba_path=other), method)
    except (SetupError, EstimateError) as e:
        return f"{words}: not estimated ({str(e).splitlines()[0]})"
    if card is None:
        return f"{words}: peak {b.memory['peak_reserved'] / 2**30:.1f} GiB reserved (--mamba-path {other})"
    v = b.verdict(card, margin)
    return f"{words}: needs {v['need'] / 2**30:.1f} GiB, {v['level']} (--mamba-path {other})"


__all__ = ["changes", "check", "other_mamba_path"]
