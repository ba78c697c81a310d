"""What the meta device would do differently from CUDA in a training step, patched for its duration
(`cuda_choices`): the simulation, the kernel count of the time model and the parameters the loss reaches
(`states.reached`) all run under it.

- SDPA: a stand-in with the flash / memory-efficient kernels' memory (saves q, k, v, output and an fp32
  log-sum-exp; backward allocates the input gradients) instead of the math path's attention matrix, except
  where CUDA also runs the math path (`hardware.cuda.sdpa_kernel`: fp32 with grouped KV heads, heads
  broadcast without `enable_gqa`);
- dropout keeps a 1-byte mask, as CUDA's fused kernel does (the CPU decomposition keeps a float mask);
- MoE experts' `grouped_mm` in any dtype, as CUDA runs it (torch's meta function checks only the bf16 fast
  path's dtypes);
- values read on the host (`hostvalues.HostValues`), and transformers' host-side checks that only warn or
  detect packing turned off.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch

from trainmem.hardware import cuda

from . import autocast
from .hostvalues import HostValues
from .inplace import InPlace


class _FlashSDPA(torch.autograd.Function):
    """Memory stand-in for the fused attention kernels: outputs of the right shape, the same saves."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                bias: torch.Tensor | None = None, flash: bool = True) -> torch.Tensor:
        # The output's memory layout decides whether the model's `transpose(1, 2).contiguous()` after
        # attention copies it. Flash allocates it like q (flash_api.cpp `mha_fwd`: empty_like of q in
        # (batch, seq, heads, dim) order), so a q made contiguous in (batch, heads, seq, dim), as GPT-NeoX's
        # rotary `cat` makes it, gets a copy per layer; the memory-efficient kernel always writes (batch,
        # seq, heads, dim) (attention.cu `_efficient_attention_forward`), so nothing is copied (an H200
        # allocator trace of a V100-emulated run, docs/lab).
        b, h, s = q.shape[:-1]
        if flash and v.shape[-1] == q.shape[-1]:
            out = torch.empty_like(q)
        else:
            out = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse, bias)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse, _ = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # then one fp32 workspace, freed when the kernel ends: 4 * b * h * s * (D + 1) + 256 bytes, with s
        # and the head size D rounded up to 128 (H200 traces of GPT-NeoX, Llama and Qwen2, torch 2.11)
        b, h, s, d = q.shape
        s128, d128 = -(-s // 128) * 128, -(-d // 128) * 128
        workspace = q.new_empty((4 * b * h * s128 * (d128 + 1) + 256,), dtype=torch.uint8)
        del workspace
        return dq, dk, dv, None, None


class _CudaDropout(torch.autograd.Function):
    """CUDA's fused dropout keeps a 1-byte mask; the meta/CPU decomposition would keep one in the input dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.new_empty(x.shape, dtype=torch.bool))
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(grad)


def _dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    return _CudaDropout.apply(x) if training and p > 0 else x


class _GroupedMM(torch.autograd.Function):
    """CUDA's grouped matrix product (`torch.nn.functional.grouped_mm`, what transformers' mixture-of-experts
    layers run by default: every token-expert pair in one product, grouped by `offs`) with its memory: the
    output forward; the input's gradient and every expert's weight gradient backward (whether or not an
    expert got a token, as PyTorch's `_grouped_mm` backward makes them). Its meta kernel takes bf16 only, where
    CUDA takes fp32 and fp16 too (autocast over fp32 weights, fp16 runs). The memory does not depend on how
    tokens are routed: the product's rows are all token-expert pairs whatever the routing."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
        # autograd keeps an operand only for the other one's gradient: frozen experts (LoRA) keep no input
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        ctx.layout = (a.shape, a.dtype, b.shape, b.stride(), b.dtype)
        return a.new_empty((a.shape[0], b.shape[-1]))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a_shape, a_dtype, b_shape, b_stride, b_dtype = ctx.layout
        grad_a = grad.new_empty(a_shape, dtype=a_dtype) if ctx.needs_input_grad[0] else None
        grad_b = (torch.empty_strided(b_shape, b_stride, dtype=b_dtype, device=grad.device)
                  if ctx.needs_input_grad[1] else None)
        return grad_a, grad_b, None


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, *args: Any, offs: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
    """`grouped_mm(mat_a, mat_b, offs=...)` of a 2-D input and 3-D expert weights, as CUDA allocates it."""
    if a.dim() != 2 or b.dim() != 3:
        raise NotImplementedError(f"grouped_mm of {a.dim()}-D by {b.dim()}-D operands is not modelled")
    return _GroupedMM.apply(a, b, offs if offs is not None else (args[0] if args else None))


_MATH_SDPA = torch.nn.functional.scaled_dot_product_attention


def sdpa_call(query: torch.Tensor, key: torch.Tensor, args: tuple,
              kwargs: dict) -> tuple[torch.dtype, bool, Any, bool]:
    """(q's dtype as the kernel gets it, grouped KV heads, the mask, heads broadcast without `enable_gqa`) of an
    SDPA call, for `hardware.cuda.sdpa_kernel`."""
    region = autocast.active()
    dtype = region.dtype if region is not None and query.is_floating_point() else query.dtype
    fewer = key.dim() >= 3 and key.shape[-3] != query.shape[-3]
    gqa = bool(kwargs.get("enable_gqa"))
    return dtype, gqa and fewer, kwargs.get("attn_mask", args[0] if args else None), fewer and not gqa


def _fused_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, flash: bool = True,
                inplace: InPlace | None = None, **kwargs: Any) -> torch.Tensor:
    """CUDA's SDPA kernel (`sdpa_kernel`) with its memory; the math path's attention matrix is saved (its mask
    added in place where `inplace` says the step runs without a mode)."""
    dtype, grouped, mask, broadcast = sdpa_call(query, key, args, kwargs)
    region = autocast.active()
    if region is not None:
        query, key, value = (region.cast(t, region.dtype) for t in (query, key, value))
    kernel = cuda.sdpa_kernel(dtype, grouped, mask, flash, broadcast)
    if kernel == "math":
        with inplace.math_attention() if inplace is not None else contextlib.nullcontext():
            return _MATH_SDPA(query, key, value, *args, **kwargs)
    # the memory-efficient kernel takes a boolean mask as an additive bias in q's dtype, converted per call
    # and saved for backward
    bias = query.new_empty(mask.shape) if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool else None
    return _FlashSDPA.apply(query, key, value, bias, kernel == "flash")


_AUTOCAST = torch.autocast


def _autocast(device_type: str, *args: Any, **kwargs: Any) -> Any:
    """`torch.autocast`, where turning autocast off for a meta tensor (peft's expert-weight LoRA folds its update
    under `torch.autocast(W.device.type, enabled=False)`) is the no-op it is on the meta device, instead of
    torch's refusal of the device type."""
    enabled = kwargs.get("enabled", args[1] if len(args) > 1 else True)
    if device_type == "meta" and not enabled:
        return contextlib.nullcontext()
    return _AUTOCAST(device_type, *args, **kwargs)


@contextlib.contextmanager
def cuda_choices(attention: str, flash: bool = True, inplace: InPlace | None = None,
                 zeros: tuple[torch.Tensor, ...] = ()) -> Iterator[HostValues]:
    """Patch what the meta device would do differently from CUDA, for the duration of a simulation (with
    `inplace`, the recording ledger's: the math SDPA path's mask add is marked for it), and answer the values
    a forward reads on the host (`hostvalues.HostValues`, yielded; `zeros`: the dummy batch, all zeros)."""
    import transformers.masking_utils as masking
    from transformers import PreTrainedModel

    F = torch.nn.functional
    saved = (F.scaled_dot_product_attention, F.dropout, masking.find_packed_sequence_indices,
             getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None),
             PreTrainedModel.warn_if_padding_and_no_attention_mask, torch.autocast)
    try:
        torch.autocast = _autocast  # type: ignore[misc]
        if attention != "eager":  # "auto" too: transformers picks SDPA wherever a model has it
            F.scaled_dot_product_attention = functools.partial(_fused_sdpa, flash=flash, inplace=inplace)
        F.dropout = _dropout
        # packed-sequence detection reads position ids on the host, which meta tensors cannot do
        masking.find_packed_sequence_indices = lambda *a, **k: None
        F.grouped_mm = torch._grouped_mm = _grouped_mm
        # a warning only (BERT-like models: is a pad id among the first and last ids?), whose index tensor is
        # made outside any dispatch mode, so that no twin holds its values
        PreTrainedModel.warn_if_padding_and_no_attention_mask = lambda *a, **k: None
        with HostValues() as host:
            for t in zeros:
                host.give(t, torch.zeros(t.shape, dtype=t.dtype))
            yield host
    finally:
        (F.scaled_dot_product_attention, F.dropout, masking.find_packed_sequence_indices, F.grouped_mm,
         torch._grouped_mm, PreTrainedModel.warn_if_padding_and_no_attention_mask, torch.autocast) = saved
