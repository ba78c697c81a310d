"""Prove that token-weighted gradient accumulation gives the gradient of the big batch.

The same samples are pushed through the model three ways: as one full batch, as micro-batches with the
loss of `trainmem.measure.accumulation.micro_batch_loss` (what `run` trains with), and as micro-batches with the
seed's naive rule. Both accumulated gradients are compared with the full batch's, parameter by
parameter. In float64 the correct rule agrees to rounding (~1e-15); the naive rule is off whenever the
micro-batches hold different numbers of label tokens (padding, or a partial last micro-batch).

Dropout is switched off by zeroing its probabilities, not with `model.eval()`: Hugging Face layers run
gradient checkpointing only in training mode, so eval() would verify a different graph from the one
`run` trains. The model stays in training mode and keeps every other setting of the setup.
Verification holds three copies of the gradients, so it is meant for small models. Torch is imported
inside the functions, as in `runner`, so that `import trainmem` and the CLI start without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError

if TYPE_CHECKING:
    import torch

    from .data import Sample

# float64 agrees to ~1e-15, so 1e-10 leaves room for any summation order. float32 sums the same
# terms in a different order (one batch vs several) and measures ~1e-7 on the tiny presets.
TOLERANCES = {"float64": 1e-10, "float32": 1e-5}

DROPOUT_NOTE = ("With dropout on, every forward draws new masks, so the micro-batches see other masks "
                "than the full batch and exact equality is not expected; verification runs with "
                "dropout off by default (probabilities set to 0, training mode kept).")

# Wrappers around the layers that say nothing about where a parameter sits (peft, Llama, GPT-NeoX, GPT-2).
_WRAPPERS = {"base_model", "model", "gpt_neox", "transformer"}


@dataclass
class GroupError:
    """Relative gradient error of one group of parameters (a module type of a layer, or a top module)."""

    group: str
    tensors: int
    rel_error: float
    naive_rel_error: float


@dataclass
class VerifyReport:
    """Full-batch gradient vs accumulated gradient, for the correct and the naive normalisation."""

    full_batch: int
    micro_batch: int
    micro_batches: int
    label_tokens: list[int]
    """Label tokens of each micro-batch; uneven counts are what the naive rule gets wrong."""
    loss_full: float
    loss_accumulated: float
    loss_naive: float
    max_rel_error: float
    """Worst ||g_acc - g_full|| / ||g_full|| over all trainable parameters."""
    naive_max_rel_error: float
    groups: list[GroupError]
    dtype: str
    tolerance: float
    dropout: bool
    model: dict[str, Any] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether the accumulated gradient matches the full batch's within the dtype's tolerance."""
        return self.max_rel_error <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (`verify-accumulation --json`)."""
        return {**asdict(self), "passed": self.passed, "window_tokens": sum(self.label_tokens),
                "loss_error": abs(self.loss_accumulated - self.loss_full),
                "naive_loss_error": abs(self.loss_naive - self.loss_full), "dropout_note": DROPOUT_NOTE}


def group_of(name: str) -> str:
    """'base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight' -> 'layer 0 self_attn'."""
    parts = name.split(".")
    while len(parts) > 1 and parts[0] in _WRAPPERS:
        parts.pop(0)
    if len(parts) > 2 and parts[1].isdigit():
        return f"layer {parts[1]} {parts[2]}"
    return parts[0]


def _dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).replace("torch.", "")


def _disable_dropout(model: torch.nn.Module) -> None:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        # HF attention passes this float to the attention kernel instead of using an nn.Dropout.
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def _wake_lora(model: torch.nn.Module, seed: int) -> None:
    # peft starts lora_B at zero, which makes lora_A's gradient exactly zero in both runs and proves
    # nothing about it; small random values give every adapter weight a real gradient.
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)


def prepare_model(spec: ModelSpec, setup: TrainSetup, dtype: torch.dtype | str = "float64",
                  device: str = "cpu", dropout: bool = False) -> torch.nn.Module:
    """The setup's model (full or LoRA, via `build_model`) in `dtype`, built on the CPU, then moved."""
    import torch

    from .build import build_model

    model = build_model(spec, setup, "cpu", "fp32").to(device=device, dtype=getattr(torch, _dtype_name(dtype)))
    if not dropout:
        _disable_dropout(model)
    if setup.peft == "lora":
        _wake_lora(model, setup.seed)
    return model


def _gradients(model: torch.nn.Module, batches: list[Sample], window_tokens: int,
               naive_steps: int | None = None) -> tuple[dict[str, torch.Tensor], float]:
    """Trainable parameters' summed gradients over `batches`, and the summed loss."""
    import torch

    from .accumulation import micro_batch_loss

    device = next(model.parameters()).device
    # None, not zeros: backward would otherwise add into the tensors an earlier call returned.
    model.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for batch in batches:
        loss = micro_batch_loss(model, {k: v.to(device) for k, v in batch.items()}, window_tokens, naive_steps)
        loss.backward()
        loss_sum += float(loss.detach())
    grads = {n: p.grad if p.grad is not None else torch.zeros_like(p)
             for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)  # hand the tensors to the caller; the model keeps none
    return grads, loss_sum


def _rel(diff: float, ref: float) -> float:
    """diff / ref, with 0 for a gradient that is exactly zero both ways (0/0)."""
    if diff == 0.0:
        return 0.0
    return diff / ref if ref > 0.0 else float("inf")


def compare_gradients(model: torch.nn.Module, samples: list[Sample], micro_batch: int, pad_id: int = 0,
                      dropout: bool = False) -> VerifyReport:
    """Gradients of `samples` as one batch vs accumulated over micro-batches of `micro_batch` samples.

    `dropout` only records, for the report, whether the model was prepared with dropout left on.
    """
    from .accumulation import label_tokens
    from .data import collate, micro_batches

    full = collate(samples, pad_id)
    batches = micro_batches(samples, micro_batch, pad_id)
    window = sum(label_tokens(b) for b in batches)
    g_full, loss_full = _gradients(model, [full], label_tokens(full))
    g_acc, loss_acc = _gradients(model, batches, window)
    g_naive, loss_naive = _gradients(model, batches, window, naive_steps=len(batches))

    per_param: list[tuple[float, float]] = []
    # Per group: tensor count and squared norms of (acc - full), (naive - full) and full, so a
    # group's error is the norm over all of its parameters together.
    sums: dict[str, list[float]] = {}
    for name, ref in g_full.items():
        ref = ref.double()
        d_acc = float((g_acc[name].double() - ref).norm())
        d_naive = float((g_naive[name].double() - ref).norm())
        r = float(ref.norm())
        per_param.append((_rel(d_acc, r), _rel(d_naive, r)))
        s = sums.setdefault(group_of(name), [0, 0.0, 0.0, 0.0])
        for i, v in enumerate((1, d_acc ** 2, d_naive ** 2, r ** 2)):
            s[i] += v
    groups = [GroupError(g, int(n), _rel(a ** 0.5, r ** 0.5), _rel(b ** 0.5, r ** 0.5))
              for g, (n, a, b, r) in sums.items()]

    dtype = _dtype_name(next(model.parameters()).dtype)
    return VerifyReport(
        full_batch=len(samples), micro_batch=micro_batch, micro_batches=len(batches),
        label_tokens=[label_tokens(b) for b in batches],
        loss_full=loss_full, loss_accumulated=loss_acc, loss_naive=loss_naive,
        max_rel_error=max(e for e, _ in per_param), naive_max_rel_error=max(e for _, e in per_param),
        groups=groups,
        dtype=dtype, tolerance=TOLERANCES.get(dtype, TOLERANCES["float32"]),
        dropout=dropout)


def _problems(setup: TrainSetup, full_batch: int, micro_batch: int, dtype: str, device: str) -> list[str]:
    import torch

    out: list[str] = []
    for flag, value in (("--full-batch", full_batch), ("--micro-batch", micro_batch)):
        if not isinstance(value, int) or value < 1:
            out.append(f"{flag}: must be a whole number >= 1, got {value!r}")
    if not out and micro_batch > full_batch:
        out.append(f"--micro-batch: {micro_batch} is larger than --full-batch {full_batch}; "
                   "accumulation needs at least one whole micro-batch in the batch")
    if dtype not in TOLERANCES:
        out.append(f"--dtype: {dtype!r} is not one of {', '.join(TOLERANCES)}")
    if setup.peft == "qlora":
        out.append("--peft qlora: 4-bit base weights cannot be made float64; verify with --peft lora, "
                   "which trains the same adapters")
    # Only the device matters here: the optimizer and precision flags of the setup are not used.
    if device == "cuda" and not torch.cuda.is_available():
        out.append("--device cuda: no CUDA device is visible; use --device cpu")
    return out


def verify_accumulation(spec: ModelSpec, setup: TrainSetup, full_batch: int, micro_batch: int,
                        dtype: torch.dtype | str = "float64", device: str = "cpu",
                        dropout: bool = False) -> VerifyReport:
    """Check accumulation on the first `full_batch` samples of the setup's data (dummy or `setup.data`).

    `full_batch` need not be a multiple of `micro_batch`: the last micro-batch is then partial, the
    case a wrong normalisation gets wrong even on equal-length data. `setup.precision` is not used:
    `dtype` decides (torch.float64 or "float64"). Raises SetupError naming the flag for bad input.
    """
    from .data import load_dataset

    problems = setup.problems(spec) + _problems(setup, full_batch, micro_batch, _dtype_name(dtype), device)
    samples, pad_id = ([], 0) if problems else load_dataset(spec, setup)
    if not problems and len(samples) < full_batch:
        flag = "--data" if setup.data else "--num-samples"
        problems.append(f"--full-batch: {full_batch} is more than the {len(samples)} samples of the data; "
                        f"lower --full-batch or give more samples ({flag})")
    if problems:
        raise SetupError(problems)
    model = prepare_model(spec, setup, dtype, device, dropout)
    report = compare_gradients(model, samples[:full_batch], micro_batch, pad_id, dropout)
    report.model = spec.describe()
    report.setup = setup.to_dict()
    return report
