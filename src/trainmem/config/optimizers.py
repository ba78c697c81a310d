"""The optimizers trainmem trains with and prices: one row each, read by every layer that needs to know one.

A row says what the optimizer is to the user (`--optimizer` name, `TrainingArguments.optim` name), what it
keeps (`state_bytes` per trainable tensor, `shared_bytes` once), what its step allocates and costs
(`foreach`, `passes`, `per_tensor`), and where its states live (`paged`). The builder that makes the real
optimizer is `measure.build.BUILDERS[name]`, the only other place a new optimizer needs: the estimate's states
and step time, the simulation, the Trainer's arguments, the page's choices and `--help` read this table.

Example: `OPTIMIZERS["adamw"].state_bytes(4096, (64, 64), 2)` is 16388: exp_avg and exp_avg_sq in the
parameter's dtype plus torch's fp32 `step`. Limitation: the state rule sees one tensor at a time (element
count, shape, bytes per element); an optimizer whose state depends on parameter groups needs a new field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

BNB_MIN_8BIT = 4096
"""bitsandbytes keeps 32-bit states for tensors with fewer elements than this (`min_8bit_size`,
bitsandbytes/optim/optimizer.py Optimizer8bit)."""

StateRule = Callable[[int, tuple[int, ...], int], int]
"""Bytes of optimizer state for one trainable tensor: (elements, shape, bytes per element) -> bytes."""


@dataclass(frozen=True)
class Optimizer:
    """One optimizer as the setup, the estimate, the simulation and the step-time model see it."""
    name: str
    """The `--optimizer` value."""
    trainer: str
    """`TrainingArguments.optim` for the same class (Trainer builds the same torch or bitsandbytes optimizer)."""
    help: str
    """What it keeps, in a few words (`--help`)."""
    state_bytes: StateRule
    """Bytes of state it keeps per trainable tensor after the first step."""
    shared_bytes: int = 0
    """State bytes kept once for all parameters (bitsandbytes' quantization maps)."""
    adam: bool = False
    """Adam's update rule (8-bit included): `plan` may trade one Adam for another, never for SGD or Adafactor."""
    foreach: bool = False
    """Its step runs torch's foreach kernels over every tensor at once (temporaries the size of the gradients)."""
    step_scalar: bool = False
    """Keeps torch's fp32 `step` tensor per parameter, whole on every rank under sharding."""
    eight_bit: bool = False
    """bitsandbytes' 8-bit states: the simulation uses trainmem's stand-in (`estimator.memory.quantized`), the
    step-time model its dequantize-update-requantize kernel."""
    paged: bool = False
    """States in CUDA managed memory: outside the allocator's peaks, inside the card's memory in use."""
    passes: float = 0.0
    """Element reads and writes per trainable parameter in a step, in the parameter's bytes (the step-time
    model's memory traffic; 8-bit optimizers are priced by `eight_bit` instead)."""
    per_tensor: float = 0.0
    """Host launches per trainable tensor in a step (optimizers that loop over tensors in Python)."""
    meta_foreach: bool | None = None
    """How the simulation builds it on the meta device where its builder cannot run there: torch AdamW with
    foreach on or off (the fused kernel has no meta implementation; its step allocates like a per-tensor
    loop). None: the builder runs as it is."""


def _adam(n: int, shape: tuple[int, ...], d: int) -> int:
    return 2 * n * d + 4  # exp_avg, exp_avg_sq in the parameter's dtype + fp32 step (torch.optim.AdamW)


def _adam_8bit(n: int, shape: tuple[int, ...], d: int) -> int:
    if n >= BNB_MIN_8BIT:  # two uint8 states + an fp32 absmax per 256-element block each
        return 2 * n + 2 * 4 * math.ceil(n / 256)
    return 8 * n  # small tensors keep 32-bit states


def _factored(n: int, shape: tuple[int, ...], d: int) -> int:
    # a row and a column vector for matrices (Shazeer & Stern 2018), + the RMS scalar transformers keeps
    return 4 * (sum(shape[:-1]) + shape[-1] if len(shape) >= 2 else n) + 4


MAPS = 2 * 256 * 4
"""bitsandbytes' two 256-entry fp32 quantization maps, shared by every parameter."""

_ROWS = (
    Optimizer("adamw", "adamw_torch", "torch AdamW, foreach: 2 states in the weights' dtype", _adam, adam=True,
              foreach=True, step_scalar=True, passes=16.0, meta_foreach=True),
    Optimizer("adamw-fused", "adamw_torch_fused", "torch AdamW, fused kernel: no step temporaries", _adam,
              adam=True, step_scalar=True, passes=7.0, meta_foreach=False),
    Optimizer("adamw-8bit", "adamw_bnb_8bit", "bitsandbytes AdamW8bit: 2 one-byte states", _adam_8bit, MAPS,
              adam=True, eight_bit=True, per_tensor=1.0),
    Optimizer("paged-adamw-8bit", "paged_adamw_8bit", "bitsandbytes PagedAdamW8bit: states in managed memory",
              _adam_8bit, MAPS, adam=True, eight_bit=True, paged=True, per_tensor=1.0),
    Optimizer("sgd", "sgd", "torch SGD without momentum: no state", lambda n, shape, d: 0, passes=3.0),
    Optimizer("adafactor", "adafactor", "transformers Adafactor: factored second moment", _factored,
              passes=8.0, per_tensor=4.0),
)
OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in _ROWS}
"""Every optimizer, by its `--optimizer` name. The passes: foreach AdamW's lerp (3), mul (2), addcmul (3),
sqrt (2), div (2), add (2), addcdiv (4) over param, grad, exp_avg, exp_avg_sq and a temporary
(torch/optim/adamw.py `_multi_tensor_adamw`, weight decay folded); fused AdamW reads p, g, m, v and writes p,
m, v once; SGD without momentum reads p, g and writes p. Per tensor: one bitsandbytes kernel per tensor;
Adafactor's several torch ops per tensor."""

TRAINER_ALIASES = {"adamw_8bit": "adamw-8bit"}
"""Other `TrainingArguments.optim` names for a row's optimizer."""


def trainer_name(name: str) -> str:
    """The `TrainingArguments.optim` value of an `--optimizer` name (itself where it names no row)."""
    return OPTIMIZERS[name].trainer if name in OPTIMIZERS else name


def by_trainer_name(optim: str) -> str:
    """The `--optimizer` name of a `TrainingArguments.optim` value (itself where none matches, so that
    validation names it as an unknown --optimizer)."""
    return next((o.name for o in OPTIMIZERS.values() if o.trainer == optim), TRAINER_ALIASES.get(optim, optim))


__all__ = ["Optimizer", "OPTIMIZERS", "BNB_MIN_8BIT", "MAPS", "by_trainer_name", "trainer_name"]
