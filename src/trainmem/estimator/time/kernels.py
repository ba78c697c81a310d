"""What one micro-step launches on the GPU, counted by running the real model's step on the meta device.

The step-time model (`timing.py`) needs three things a parameter inventory cannot say: how many kernels the
host launches per micro-step (each costs host time whether it moves a byte or not), how many bytes the
kernels that are not matrix products read and write (norms, activations, rotary embeddings, residual adds,
the loss's upcast and log-softmax, LoRA's dropout and scaling, autocast's casts, the math attention path's
softmax), and which attention kernel each layer's call runs, over how much of the product (a sliding
window's mask rules flash out and makes the kernel compute the whole product). All depend on how each
architecture's modeling code is written: GPT-2's unfused GELU is eight kernels where Llama's SiLU is one,
Gemma has four norms per layer, Qwen3 and OLMo-2 normalize q and k. So they are counted, not assumed: the
model is built on the meta device as the simulate method builds it (`simulate.model_builder`, peft and the
bitsandbytes stand-ins included) and one forward and backward run under a dispatch mode that sees every ATen
operator.

A counted operator is a kernel unless it only makes a view or an empty tensor. Autocast's casts are counted
as bytes but not as launches: CUDA autocast casts inside the dispatcher, in C++, without the Python that a
module's operators cost (the fit of the H200 step times agrees: `docs/time-model.md`). The weights' matrix
products are left to `timing.py`'s FLOP count; attention's FLOPs are counted here per call (`Kernels.attention`),
fused attention being a stand-in whose bytes are in its FLOP time.

To stay fast (the analytic estimate and `plan`'s search call it for every setup), the step is traced on
the model cut to one and to two decoder layers, each at micro-batch 1 and 2: launches are the one-layer
count plus the layers' difference per further layer; bytes are bilinear in layers and micro-batch. The
four traces of a 7-8B model take well under a second on the 2-core CPU machine and are cached per setup
shape (`_CACHE`); batch size does not change the counts, only the bytes.

TRL's fused LM head (`--engine sft`, `estimator/memory/trlhead.py`) is not counted here; the step is timed with
transformers' loss. Why that is close enough: the head launches about six kernels per (4096-token x 32768-column)
tile, tens per step beside the thousands of the layers; it skips the full logits' elementwise passes (their
upcast, log-softmax and gradient, about 14 bytes per logit) but recomputes the projection in backward (2 x tokens
x vocabulary x hidden FLOPs more, a third of the head's). For Llama-3.2-1B at 8192 tokens those are ~15 GB of
traffic saved against ~4 TFLOP added, a few milliseconds each way in a step of over 100 ms on an H100.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.estimator.memory import autocast
from trainmem.hardware import cuda
from trainmem.hardware.gpus import GPU
from trainmem.measure.accumulation import micro_batch_loss
from trainmem.measure.ledger import StateBytes, TensorLedger

_A = torch.ops.aten
_MATMULS = {_A.mm.default, _A.addmm.default, _A.bmm.default, _A.baddbmm.default}
_BATCHED = {_A.bmm.default, _A.baddbmm.default}
_NO_KERNEL = {_A._unsafe_view.default, _A.detach.default, _A.alias.default, _A.lift_fresh.default,
              _A.empty.memory_format, _A.empty_strided.default, _A.empty_like.default, _A.new_empty.default,
              _A.new_empty_strided.default}
"""Operators that launch nothing: views and allocations (an empty tensor is the caching allocator's work)."""


@dataclass(frozen=True)
class Kernels:
    """One micro-step's kernels on the model at full depth."""

    launches: float
    """Kernels launched per micro-step by forward, recompute and backward (autocast's casts excluded)."""
    bytes_fixed: float
    """Bytes the non-matmul kernels move per micro-step whatever the micro-batch (weight-sized work: the
    embedding's gradient, norm and adapter weight gradients)."""
    bytes_per_sample: float
    """Bytes they move per sequence of the micro-batch."""
    unaligned_per_sample: float = 0.0
    """FLOPs per sequence of the half-precision matrix products with a dimension that is not a multiple of 8
    (GPT-2's vocabulary of 50257, a vocabulary grown by one added token): cuBLAS cannot run them on its
    fastest tensor-core kernels (`timing.UNALIGNED_SLOWDOWN`)."""

    attention_per_sample: dict[str, float] = dataclasses.field(default_factory=dict)
    """FLOPs per sequence of attention's scores and values, forward, recompute and backward, by the kernel that
    runs them (`flash-half`, `efficient-half`, `efficient-fp32`, `math-half`, `math-fp32`). Which kernel CUDA
    picks is decided per call, as the simulate method decides it (`hardware.cuda.sdpa_kernel`): a sliding window's
    mask rules flash out for that layer, and a fused kernel skips the masked half of a causal product but no
    block of an explicit mask. The math path (eager attention, grouped heads in fp32) is its batched products."""

    def bytes(self, batch: int) -> float:
        return self.bytes_fixed + self.bytes_per_sample * batch

    def unaligned(self, batch: int) -> float:
        return self.unaligned_per_sample * batch

    def attention(self, batch: int) -> dict[str, float]:
        return {k: v * batch for k, v in self.attention_per_sample.items()}


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.launches = 0
        self.bytes = 0
        self.unaligned = 0
        self.attention: Counter[str] = Counter()
        self.casting = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if func in _NO_KERNEL or (returns and all(r.alias_info is not None and not r.alias_info.is_write
                                                  for r in returns)):
            return out
        if not self.casting:
            self.launches += 1
        if func not in _MATMULS:
            self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                              if isinstance(t, torch.Tensor))
        else:
            a, b = args[:2] if func in (_A.mm.default, _A.bmm.default) else args[1:3]  # addmm: (bias, a, b)
            half = out.dtype in (torch.float16, torch.bfloat16)
            if half and any(d % 8 for d in (a.shape[-2], a.shape[-1], b.shape[-1])):
                self.unaligned += 2 * out.numel() * a.shape[-1]
            if func in _BATCHED and a.shape[-1] > 1:  # attention's math path, not rotary's outer product
                self.attention["math-half" if half else "math-fp32"] += 2 * out.numel() * a.shape[-1]
        return out


class _Casts:
    """Marks autocast's casts while they run, so that `_Count` leaves them out of the launches."""

    def __init__(self, count: _Count):
        self.count = count
        self.original = autocast.CudaAutocast.cast

    def __enter__(self) -> None:
        original, count = self.original, self.count

        def cast(region: autocast.CudaAutocast, x: Any, dtype: torch.dtype) -> Any:
            count.casting += 1
            try:
                return original(region, x, dtype)
            finally:
                count.casting -= 1

        autocast.CudaAutocast.cast = cast  # type: ignore[method-assign]

    def __exit__(self, *exc: Any) -> None:
        autocast.CudaAutocast.cast = self.original  # type: ignore[method-assign]


class _StandIns:
    """Counts the kernels behind simulate's stand-ins, which allocate their outputs and launch nothing on
    meta: CUDA's fused dropout is one kernel forward (reads x, writes the output and a 1-byte mask) and one
    backward (reads the gradient and the mask, writes the input gradient); a fused attention kernel is one
    launch forward and two backward (FlashAttention-2's preprocessing and main kernel), its bytes part of its
    FLOP time (`timing.EFF_FLASH`). flash-attn's own kernels (`--attention flash_attention_2|3`) are counted as
    SDPA's flash kernel (`flash-half`), launches and FLOPs alike: the same FA2 code; FA3's faster Hopper kernels
    and FA2's dq conversion launch are not modelled (kept simple). Installed inside `standins.cuda_choices`,
    around its stand-ins."""

    def __init__(self, count: _Count, flash: bool):
        self.count = count
        self.flash = flash

    def __enter__(self) -> None:
        from trainmem.estimator.memory import standins
        from trainmem.estimator.memory.standins import sdpa_call

        F = torch.nn.functional
        self.flash_attn = standins._flash_attn
        flash_attn = self.flash_attn

        def counted_flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, version: int, causal: bool,
                               *args: Any) -> Any:
            out = flash_attn(q, k, v, version, causal, *args)
            count.launches += 3
            b, sq, h, d = q.shape  # (batch, seq, heads, dim), as flash_attn_func takes them
            flops = 2 * b * h * sq * k.shape[1] * (d + v.shape[-1]) / (2 if causal else 1)
            count.attention["flash-half"] += flops
            if out.requires_grad:
                out.register_hook(lambda grad: count.attention.update({"flash-half": 2 * flops}))
            return out

        standins._flash_attn = counted_flash_attn
        self.saved = (F.dropout, F.scaled_dot_product_attention, F.grouped_mm)
        dropout, sdpa, count, flash = F.dropout, F.scaled_dot_product_attention, self.count, self.flash
        grouped = F.grouped_mm

        def counted_grouped_mm(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            # one launch forward, two backward (the input's and the weights' gradients); the FLOPs are the
            # experts' share of the weights' (`timing.workload`)
            out = grouped(a, b, *args, **kwargs)
            count.launches += 1
            if out.requires_grad:
                out.register_hook(lambda grad: setattr(count, "launches", count.launches + 2))
            return out

        def counted_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
            if training and p > 0:
                count.launches += 2
                count.bytes += x.numel() * (5 * x.element_size() + 2)
            return dropout(x, p, training, inplace)

        def counted_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                         **kwargs: Any) -> Any:
            dtype, grouped, mask, broadcast = sdpa_call(query, key, args, kwargs)
            kernel = cuda.sdpa_kernel(dtype, grouped, mask, flash, broadcast)
            out = sdpa(query, key, value, *args, **kwargs)
            if kernel == "math":  # its operators, products included, are counted as they run
                return out
            count.launches += 3
            # scores and values, 2 s_q s_k (d_qk + d_v) per head, halved where the kernel skips a causal
            # product's masked blocks; backward is twice that, counted once the gradient reaches the call (a
            # checkpointed layer's recomputed call is forward work only)
            b, h, sq, d = query.shape
            fused = f"{kernel}-{'half' if dtype in (torch.float16, torch.bfloat16) else 'fp32'}"
            flops = 2 * b * h * sq * key.shape[-2] * (d + value.shape[-1])
            causal = kwargs.get("is_causal", args[2] if len(args) > 2 else False)  # (mask, dropout_p, is_causal)
            flops /= 2 if causal and mask is None else 1
            count.attention[fused] += flops
            if out.requires_grad:
                out.register_hook(lambda grad: count.attention.update({fused: 2 * flops}))
            return out

        F.dropout, F.scaled_dot_product_attention, F.grouped_mm = counted_dropout, counted_sdpa, counted_grouped_mm

    def __exit__(self, *exc: Any) -> None:
        from trainmem.estimator.memory import standins

        F = torch.nn.functional
        F.dropout, F.scaled_dot_product_attention, F.grouped_mm = self.saved
        standins._flash_attn = self.flash_attn


class _Traced(NamedTuple):
    """What one trace counted (`_Count`)."""

    launches: int
    bytes: int
    unaligned: int
    attention: dict[str, float]


def _trace(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU) -> _Traced:
    """The kernels of one micro-step of `setup` on `spec`'s model, on the meta device."""
    from trainmem.estimator.memory.simulate import model_builder, train_mode
    from trainmem.estimator.memory.standins import cuda_choices
    from trainmem.measure.build import AUTOCAST_DTYPES

    model = model_builder(spec, setup, precision, card)(TensorLedger(lambda: StateBytes(0, 0, 0)))
    amp = AUTOCAST_DTYPES.get(precision)
    train_mode(model, setup, amp)
    ids = torch.zeros((setup.batch_size, setup.seq_len), dtype=torch.long, device="meta")
    count = _Count()
    with cuda_choices(setup.attention, card.flash, zeros=(ids,)), _StandIns(count, card.flash), _Casts(count), count:
        with autocast.region(amp):
            loss = micro_batch_loss(model, {"input_ids": ids, "labels": ids}, setup.batch_size * setup.seq_len)
        loss.backward()
    return _Traced(count.launches, count.bytes, count.unaligned, dict(count.attention))


_CACHE: dict[tuple, Kernels] = {}


def count(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU) -> Kernels:
    """The kernels of one micro-step of `setup` (its micro-batch aside) on `spec`'s model at full depth."""
    setup = setup.resolved(spec)
    key = (spec.name, repr(sorted(spec.config.items())), setup.peft, setup.lora_r, repr(setup.lora_targets),
           setup.attention, setup.checkpointing, setup.seq_len, precision, card.flash)
    if key not in _CACHE:
        _CACHE[key] = _extrapolated(spec, setup, precision, card)
    return _CACHE[key]


def _extrapolated(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU) -> Kernels:
    layers = int(spec.text_config().num_hidden_layers)  # transformers maps GPT-2's n_layer onto it
    traced = None
    if layers > 2:  # two layers or fewer: the whole model is as cheap to trace as the cut ones
        try:
            traced = {(n, b): _trace(spec.cut(n), setup.replace(batch_size=b), precision, card)
                      for n in (1, 2) for b in (1, 2)}
        except Exception:  # a config whose per-layer settings do not survive the cut: trace it whole
            traced = None
    if traced is None:
        try:
            whole = {b: _trace(spec, setup.replace(batch_size=b), precision, card) for b in (1, 2)}
        except Exception as e:
            raise ValueError(f"cannot count the kernels of a training step of {spec.name}: {e}") from e
        one, two = whole[1], whole[2]
        return Kernels(one.launches, 2 * one.bytes - two.bytes, two.bytes - one.bytes, two.unaligned - one.unaligned,
                       one.attention)

    def at(b: int, field: str) -> float:
        one, two = (getattr(traced[(n, b)], field) for n in (1, 2))
        return one + (two - one) * (layers - 1)

    per_sample = at(2, "bytes") - at(1, "bytes")
    return Kernels(at(1, "launches"), at(1, "bytes") - per_sample, per_sample,
                   at(2, "unaligned") - at(1, "unaligned"), _attention(spec, setup, precision, card, traced))


def _attention(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU,
               traced: dict[tuple[int, int], _Traced]) -> dict[str, float]:
    """Attention's FLOPs per sequence at full depth, extrapolated from the cut models at micro-batch 1 as the
    launches are (the first layer differs: under LoRA or QLoRA its input needs no gradient, so neither does
    a frozen k), but by layer type where the config gives each layer one (Gemma's sliding and full layers,
    whose kernels differ): the cut models hold only the first layers' types, so each type gets its own."""
    hf = spec.text_config()  # layer types given in the config or derived by transformers (Gemma-3's pattern)
    types, layers = getattr(hf, "layer_types", None), int(hf.num_hidden_layers)
    one, two = traced[(1, 1)].attention, traced[(2, 1)].attention
    if not isinstance(types, list) or len(set(types)) < 2:
        return {k: one.get(k, 0) + (two.get(k, 0) - one.get(k, 0)) * (layers - 1) for k in {*one, *two}}
    out: Counter[str] = Counter(one)  # the first layer, of the first type
    single = setup.replace(batch_size=1)
    for kind, n in Counter(types[:layers]).items():
        n -= kind == types[0]
        if n:
            first = one if kind == types[0] else _trace(spec.cut(1, kind), single, precision, card).attention
            pair = _trace(spec.cut(2, kind), single, precision, card).attention
            out.update({k: n * (pair.get(k, 0) - first.get(k, 0)) for k in {*first, *pair}})
    return dict(out)


__all__ = ["Kernels", "count"]
