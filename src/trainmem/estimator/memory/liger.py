"""Liger's kernels (`--kernels liger`) on the meta device: stand-ins with the allocations and saves of
liger-kernel's Triton kernels (`hardware.cuda.LIGER_VERSION`'s sources), patched into a built model the way
`apply_liger_kernel_to_<family>(model=...)` patches it (`hardware.cuda.LIGER_FAMILIES`), so that no Liger or
Triton is needed where the estimate runs.

- fused linear cross-entropy (`ops/fused_linear_cross_entropy.py`): the loss and both gradients in the
  forward, chunk by chunk, so the (tokens x vocabulary) logits never exist; it saves the input's gradient
  (tokens x hidden) and, where the output head trains, the head's (vocabulary x hidden); backward only scales
  them in place;
- RMSNorm (`ops/rms_norm.py`): saves its input, its weight and an fp32 reciprocal RMS per row; backward
  writes the input's gradient over the incoming one and sums an fp32 (SMs x hidden) partial weight gradient;
- SwiGLU (`ops/swiglu.py`): saves gate and up; backward writes their gradients over them;
- RoPE (`ops/rope.py`): rotates q and k in place, saves cos and sin; backward rotates the gradients in place.
"""

from __future__ import annotations

import contextlib
import sys
from types import MethodType
from typing import Any, Iterator

import torch

from trainmem.hardware.cuda import LIGER_FAMILIES

from . import autocast

IGNORE = -100


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def chunk_rows(tokens: int, hidden: int, vocabulary: int) -> int:
    """Rows of the fused loss's logits per chunk: `next_power_of_2(cdiv(BT, cdiv(V, H)))`, at most BT, so that a
    chunk's logits are about as large as the hidden states (`fused_linear_cross_entropy_forward`,
    `chunk_mem_const` 1)."""
    return min(_next_power_of_2(_cdiv(tokens, _cdiv(vocabulary, hidden))), tokens)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """`LigerFusedLinearCrossEntropyFunction` (reduction sum or mean) with its memory."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        tokens, hidden = x.shape
        vocabulary = weight.shape[0]
        rows = chunk_rows(tokens, hidden, vocabulary)
        grad_input = torch.zeros_like(x)
        # accum_dtype None: the head's gradient accumulates in the head's dtype
        grad_weight = torch.zeros_like(weight) if x.requires_grad and weight.requires_grad else None
        loss_1d = torch.zeros(tokens, dtype=torch.float32, device=x.device)
        count = (target != IGNORE).sum()  # read on the host (`.item()`) in the real kernel
        del count
        region = autocast.active()
        # `_can_use_mm_out`: grad is off inside forward; one dtype, the autocast dtype where autocast is on
        mm_out = (x.dtype == weight.dtype and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
                  and (region is None or region.dtype == x.dtype))
        storage = x.new_empty((rows, vocabulary)) if mm_out else None
        for start in range(0, tokens, rows):
            end = min(start + rows, tokens)
            x_chunk = x[start:end]
            if storage is not None:
                logits = storage[:end - start]
            elif region is not None:
                logits = region.cast(x_chunk, region.dtype) @ region.cast(weight, region.dtype).t()
            else:
                logits = x_chunk @ weight.t()
            # the cross-entropy kernel writes the loss per row and the logits' gradient over the logits
            # then grad_input's rows = grad_logits @ weight: `mm(out=...)` into them (nothing allocated; the meta
            # device's `out=` would make new storage), else a product copied in
            if not (mm_out and logits.dtype == grad_input.dtype):
                w = region.cast(weight, region.dtype) if region is not None else weight
                g = region.cast(logits, region.dtype) if region is not None else logits
                grad_input[start:end] = g @ w
                del w, g
            if grad_weight is not None:
                _accumulate(grad_weight, logits, x_chunk)
            del logits, x_chunk
        del storage
        loss = torch.sum(loss_1d)
        del loss_1d
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        ctx.save_for_backward(grad_input, grad_weight)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # `fused_linear_cross_entropy_backward`: the stored gradients scaled in place (element_mul_kernel)
        grad_input, grad_weight = ctx.saved_tensors
        return grad_input, grad_weight, None


def _accumulate(grad_weight: torch.Tensor, grad_logits: torch.Tensor, x_chunk: torch.Tensor) -> None:
    """The head's gradient += grad_logits^T x_chunk, with the temporaries of the path Liger takes on a card of
    compute capability 8.0 or more: `addmm(out=...)` into the accumulator (the input chunk cast to the logits'
    half dtype where it differs), else the legacy product and its fp32 copy."""
    half = grad_logits.dtype in (torch.float16, torch.bfloat16)
    if half and grad_weight.dtype in (torch.float32, grad_logits.dtype):
        chunk = x_chunk.to(grad_logits.dtype) if x_chunk.dtype != grad_logits.dtype else x_chunk
        del chunk
        return
    product = torch.mm(grad_logits.t(), x_chunk.to(grad_logits.dtype)).float()
    grad_weight += product


class _RMSNorm(torch.autograd.Function):
    """`LigerRMSNormFunction` (casting mode llama, in place): Y in X's dtype; saves X, W, an fp32 RSTD per row."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, sms: int) -> torch.Tensor:
        x = x.contiguous()  # `ensure_contiguous`
        y = torch.empty_like(x)
        rstd = torch.empty(x.numel() // x.shape[-1], dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, weight, rstd)
        ctx.sms = sms
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        dw = None
        if ctx.needs_input_grad[1]:
            partial = torch.empty((ctx.sms, x.shape[-1]), dtype=torch.float32, device=x.device)
            dw = partial.sum(dim=0).to(weight.dtype)
        return dy, dw, None  # dX written over dY


class _SiLUMul(torch.autograd.Function):
    """`LigerSiLUMulFunction`: silu(a) * b into a new tensor; saves a and b, whose storage backward reuses for
    their gradients."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        dc.contiguous()
        return a.view(a.shape), b.view(b.shape)


class _Rope(torch.autograd.Function):
    """`LigerRopeFunction`: q and k rotated in place in (batch, seq, heads, dim) order; saves cos and sin."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2)

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dq, dk = dq.transpose(1, 2).contiguous(), dk.transpose(1, 2).contiguous()
        return dq.transpose(1, 2), dk.transpose(1, 2), None, None


def _rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *args: Any,
            **kwargs: Any) -> Any:
    return _Rope.apply(q, k, cos, sin)


def _swiglu_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """`LigerSwiGLUMLP.forward`."""
    return self.down_proj(_SiLUMul.apply(self.gate_proj(x), self.up_proj(x)))


def _lce_forward(self: Any, input_ids: Any = None, attention_mask: Any = None, labels: Any = None,
                 logits_to_keep: int = 0, **kwargs: Any) -> Any:
    """Liger's `lce_forward` in training with labels (`skip_logits`): the decoder's hidden states go to the fused
    loss with the head's weight, labels padded with the ignore index and shifted (`LigerForCausalLMLoss`);
    reduction sum over `num_items_in_batch` where given, else mean. No logits are returned."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    hidden = outputs[0][:, slice(-logits_to_keep, None), :]
    if labels is None or not self.training:
        raise NotImplementedError("--kernels liger: only a training forward with labels is modelled")
    shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:].contiguous()
    loss = _FusedLinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight,
                                          shifted.view(-1))
    items = kwargs.get("num_items_in_batch")
    if items is not None:
        loss = loss / items
    return CausalLMOutputWithPast(loss=loss, logits=None)


def _norm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(x, self.weight, self.liger_sms)


@contextlib.contextmanager
def patched(model: torch.nn.Module, sms: int, loss: bool = True) -> Iterator[None]:
    """The model with Liger's kernels in, as `apply_liger_kernel_to_<family>(model=...)` puts them (a LoRA model:
    its base model's modules, which peft's layers sit inside), for the duration; `sms`: the card's SMs, the rows
    of RMSNorm's partial weight gradient; `loss` False leaves the fused linear cross-entropy out, as TRL's
    SFTTrainer does (`liger_kernel_config["fused_linear_cross_entropy"] = False`) for its own fused head."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = base.config.model_type
    decoder = getattr(base, base.base_model_prefix)
    module = sys.modules[type(base).__module__]
    norms = [decoder.norm] + [layer.get_submodule(name) for layer in decoder.layers for name in LIGER_FAMILIES[family]]
    mlps = [layer.mlp for layer in decoder.layers]
    rotary = module.apply_rotary_pos_emb
    try:
        module.apply_rotary_pos_emb = _rotary
        if loss:
            base.forward = MethodType(_lce_forward, base)
        for norm in norms:
            norm.liger_sms = sms
            norm.forward = MethodType(_norm_forward, norm)
        for mlp in mlps:
            mlp.forward = MethodType(_swiglu_forward, mlp)
        yield
    finally:
        module.apply_rotary_pos_emb = rotary
        for m in [base, *norms, *mlps]:
            m.__dict__.pop("forward", None)
