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


class _FlashAttn(torch.autograd.Function):
    """Memory stand-in for flash-attn's `FlashAttnFunc` (`cuda.FLASH_ATTN_SOURCE`), on q, k, v in (batch, seq,
    heads, dim) as `flash_attn_func` takes them. Derived from the sources, not measured:

    FA2 (flash_attn_interface.py `FlashAttnFunc`, flash_api.cpp `mha_fwd` / `mha_bwd`):
    - forward: q, k and v padded (`F.pad`, a copy each) to a head size that is a multiple of 8 where it is not;
      `maybe_contiguous` copies an input whose last dimension is strided; `out` = `empty_like(q)`; `softmax_lse`
      fp32 (b, h, s_q); `rng_state` 2 x int64; where `cuda.flash_splits` > 1 fp32 `out_accum` (splits, b, h, s_q,
      d_r) and `softmax_lse_accum` (splits, b, h, s_q), freed on return. Saved: padded q, k, v, out, softmax_lse,
      rng_state; the output is `out[..., :d]`, a view.
    - backward: dq, dk, dv = `empty_like` of the padded q, k, v; dout padded where the head size is; `softmax_d`
      fp32 (b, h, s_q rounded to 128), `dq_accum` fp32 (b, s_q rounded to 128, h, d_r) with d_r the head size
      rounded to 32 (64 above 128); with fewer KV heads `dk_expanded`, `dv_expanded` (b, s_k, h, d) in q's dtype,
      summed into dk, dv; all freed on return.
    FA3 (hopper/flash_attn_interface.py `FlashAttnFunc`, hopper/flash_api.cpp `mha_fwd` / `mha_bwd`):
    - forward: no padding (head sizes are multiples of 8 already); `out` a new (b, s_q, h, d_v) tensor;
      `softmax_lse` fp32 (b, h, s_q); a 1-entry int32 tile semaphore for a causal call, freed on return;
      one split (`FlashAttnFunc`'s `num_splits=1`). Saved: q, k, v, out, softmax_lse.
    - backward: dq, dk, dv `empty_like`; `softmax_d` and `softmax_lse_log2` fp32 (b, h, s_q rounded to kBlockM),
      `dq_accum` fp32 (b, h, s_q rounded to kBlockM x d_r), d_r the head size rounded up to 64/96/128/192/256;
      with fewer KV heads fp32 `dk_accum`, `dv_accum` (b, h_k, s_k rounded to kBlockN x d_r); the int32
      `dq_semaphore` (s_q / kBlockM, b, h); all freed on return (kBlockM/N: sm90's, `_fa3_blocks`).

    What differs from PyTorch's flash SDPA (`_FlashSDPA`, the same FA2 kernels): inputs and output in (b, s, h, d)
    order, so no layout copy of the output; the backward's fp32 buffers are FA2 2.8.3's (seqlen to 128, head
    size to 32) where PyTorch's build allocates one workspace with the head size rounded to 128; the split-KV
    forward buffers; grouped KV heads taken as they are (no `repeat_kv`), with FA2's expanded dk, dv."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, version: int, causal: bool,
                dropout: float, sms: int) -> torch.Tensor:
        d = q.shape[-1]
        if version == 2 and d % 8:
            q, k, v = (torch.nn.functional.pad(t, [0, 8 - d % 8]) for t in (q, k, v))
        q, k, v = (t.contiguous() if t.stride(-1) != 1 else t for t in (q, k, v))
        b, s, h, dp = q.shape
        lse = q.new_empty((b, h, s), dtype=torch.float32)
        if version == 2:
            out = torch.empty_like(q)
            splits = cuda.flash_splits(b, h, s, k.shape[1], dp, sms, dropout)
            if splits > 1:
                d_r = -(-dp // 32) * 32 if dp <= 128 else -(-dp // 64) * 64
                accum = (q.new_empty((splits, b, h, s), dtype=torch.float32),
                         q.new_empty((splits, b, h, s, d_r), dtype=torch.float32))
                del accum
            saved = (q, k, v, out, lse, q.new_empty((2,), dtype=torch.int64))
        else:
            out = q.new_empty((b, s, h, v.shape[-1]))
            semaphore = q.new_empty((1,), dtype=torch.int32) if causal else None
            del semaphore
            saved = (q, k, v, out, lse)
        ctx.save_for_backward(*saved)
        ctx.flash = (version, causal, d)
        return out[..., :d] if dp != d else out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        version, causal, d = ctx.flash
        q, k, v = ctx.saved_tensors[:3]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        b, s, h, dp = q.shape
        s_k, h_k = k.shape[1], k.shape[2]
        f32 = torch.float32
        if version == 2:
            if dp != d:
                dout = torch.nn.functional.pad(dout, [0, dp - d])
            dout = dout.contiguous() if dout.stride(-1) != 1 else dout
            s128, d_r = -(-s // 128) * 128, (-(-dp // 32) * 32 if dp <= 128 else -(-dp // 64) * 64)
            work = [q.new_empty((b, h, s128), dtype=f32), q.new_empty((b, s128, h, d_r), dtype=f32)]
            if h_k != h:
                work += [q.new_empty((b, s_k, h, dp)), q.new_empty((b, s_k, h, dp))]
        else:
            dout = dout.contiguous() if dout.stride(-1) != 1 else dout
            d_r = next(r for r in (64, 96, 128, 192, 256) if max(dp, v.shape[-1]) <= r or r == 256)
            block_m, block_n = _fa3_blocks(d_r, causal)
            sm, sn = -(-s // block_m) * block_m, -(-s_k // block_n) * block_n
            work = [q.new_empty((b, h, sm), dtype=f32), q.new_empty((b, h, sm), dtype=f32),
                    q.new_empty((b, h, sm * d_r), dtype=f32)]
            if h_k != h:
                work += [q.new_empty((b, h_k, sn * d_r), dtype=f32), q.new_empty((b, h_k, sn * d_r), dtype=f32)]
            work.append(q.new_empty((-(-s // block_m), b, h), dtype=torch.int32))
        del work, dout
        return dq[..., :d], dk[..., :d], dv[..., :v.shape[-1] if version == 3 else d], None, None, None, None


def _fa3_blocks(d_r: int, causal: bool) -> tuple[int, int]:
    """FA3's backward tile on sm90 (hopper/flash_api.cpp `mha_bwd`: kBlockM_sm90, kBlockN_sm90; no softcap or
    local window, as transformers' training calls make it)."""
    block_m = 128 if d_r <= 64 else 64 if d_r <= 96 else (64 if causal else 80) if d_r <= 128 else 64
    block_n = 128 if d_r <= 128 else 96 if d_r <= 192 else 80
    return block_m, block_n


def _flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, version: int, causal: bool, dropout: float,
                sms: int) -> torch.Tensor:
    """`flash_attn_func`'s memory (`_FlashAttn`); the time model counts its launches by wrapping this name."""
    return _FlashAttn.apply(q, k, v, version, causal, dropout, sms)


FLASH_KEYS = {name: f"trainmem_{name}" for name in cuda.FLASH_ATTENTIONS}
"""transformers' flash attention names -> the `AttentionInterface` keys the stand-in is registered under. Each
contains the name, so transformers' `is_flash_attention_requested` treats the model as flash (its masks and
position ids); set on the model's configs directly (`use_flash`), as `set_attn_implementation` would try to import
the package."""


def _flash_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' `integrations/flash_attention.flash_attention_forward` and `_flash_attention_forward` around
    `flash_attn_func`: q, k, v transposed to (b, s, h, d) (views); v padded to q's head size where it is smaller
    (MLA), the output cropped; fp32 q, k, v cast to the autocast dtype (else the first Linear's weight dtype:
    `get_target_dtype`, `fa_peft_integration_check`); grouped KV heads passed as they are. The simulated batch has
    no padding and no packing, so the mask is None and the call is `flash_attn_func`'s, not the varlen one."""
    version = cuda.FLASH_ATTENTIONS[module.config._attn_implementation.removeprefix("trainmem_")]
    if attention_mask is not None:
        raise NotImplementedError("flash attention with a padding mask (flash_attn_varlen_func) is not modelled")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    head_dim, v_dim = q.shape[-1], v.shape[-1]
    if v_dim != head_dim:
        v = torch.nn.functional.pad(v, [0, head_dim - v_dim])
    if q.dtype == torch.float32:
        region = autocast.active()
        target = region.dtype if region is not None else next(
            m.weight.dtype for m in module.modules() if isinstance(m, torch.nn.Linear))
        q, k, v = (t.to(target) for t in (q, k, v))
    causal = module.is_causal if is_causal is None else is_causal
    out = _flash_attn(q, k, v, version, causal, dropout, _FLASH_SMS[0])
    return (out[..., :v_dim] if v_dim != head_dim else out), None


_FLASH_SMS = [132]
"""The card's SMs for FA2's split-KV heuristic, set by `cuda_choices` for the simulation's duration."""


def _register_flash() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    for key in FLASH_KEYS.values():
        AttentionInterface.register(key, _flash_forward)
        AttentionMaskInterface.register(key, flash_attention_mask)


def use_flash(model: torch.nn.Module, attention: str) -> None:
    """Point a model built with SDPA (and its sub-models) at the flash stand-in registered for `attention`."""
    from transformers import PreTrainedModel

    _register_flash()
    for m in model.modules():
        if isinstance(m, PreTrainedModel):
            m.config._attn_implementation_internal = FLASH_KEYS[attention]


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
                 zeros: tuple[torch.Tensor, ...] = (), sms: int = 132) -> Iterator[HostValues]:
    """Patch what the meta device would do differently from CUDA, for the duration of a simulation (with
    `inplace`, the recording ledger's: the math SDPA path's mask add is marked for it), and answer the values
    a forward reads on the host (`hostvalues.HostValues`, yielded; `zeros`: the dummy batch, all zeros). `sms`:
    the card's SMs, for flash-attn's split-KV forward (models `use_flash` points at the FlashAttention stand-in)."""
    import transformers.masking_utils as masking
    from transformers import PreTrainedModel

    F = torch.nn.functional
    saved = (F.scaled_dot_product_attention, F.dropout, masking.find_packed_sequence_indices,
             getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None),
             PreTrainedModel.warn_if_padding_and_no_attention_mask, torch.autocast)
    _FLASH_SMS[0], sms_before = sms, _FLASH_SMS[0]
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
        _FLASH_SMS[0] = sms_before
