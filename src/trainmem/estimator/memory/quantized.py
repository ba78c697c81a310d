"""Memory stand-ins for bitsandbytes on the meta device, so that the simulate method runs QLoRA and 8-bit
AdamW with no bitsandbytes and no GPU. Each allocates what the CUDA code allocates, in its order, and
computes nothing (read from bitsandbytes 0.50 `nn.Linear4bit`, `functional.quantize_4bit` /
`dequantize_4bit`, `autograd.MatMul4Bit`, `optim.Optimizer2State`, and peft 0.21
`prepare_model_for_kbit_training` / `tuners.lora.bnb.Linear4bit`; checked against H200 runs in
docs/lab/estimate-validation.md).

The QLoRA build replays what `trainmem run` does on the GPU (`build.build_model`): every weight of the
checkpoint is loaded in its dtype into the one segment transformers' warm-up allocation left cached, each
Linear but the output head is quantized on the device (its 16-bit copy then freed), peft casts every other
parameter to fp32 and empties the allocator's cache, then adds the fp32 adapters.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trainmem.measure.ledger import TensorLedger

from .states import NESTED_BLOCK, NF4_BLOCK

QUANTIZED_MIN = 4096
"""bitsandbytes keeps 32-bit optimizer state for tensors under 4096 elements (`min_8bit_size`)."""


def _empty(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((n,), dtype=dtype, device="meta")


class _MatMul4Bit(torch.autograd.Function):
    """bitsandbytes' MatMul4Bit: dequantize the weight to the compute dtype for the product (forward and
    again in backward), keep nothing of the input, return the input's gradient only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor | None, shape: tuple[int, int],
                blocks: int) -> torch.Tensor:
        ctx.shape, ctx.blocks = shape, blocks
        return _dequant_linear(x, shape, blocks, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        weight = _dequantize(ctx.shape, ctx.blocks, grad.dtype)
        return torch.matmul(grad, weight), None, None, None


def _dequant_linear(x: torch.Tensor, shape: tuple[int, int], blocks: int,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """bitsandbytes 0.50's forward `_dequant_linear_fallback` (what `gemm_4bit` runs on the H200 past a few
    tokens): the nested absmax restored into one fp32 buffer, then that plus its offset into a second, then
    the 16-bit weight and the product; the three buffers are freed only when it returns (an H200 trace of a
    phi-3-mini QLoRA run: two absmax-sized blocks before each weight; docs/lab)."""
    restored = _empty(blocks, torch.float32)
    absmax = _empty(blocks, torch.float32)
    weight = torch.empty(shape, dtype=x.dtype, device="meta")
    out = torch.nn.functional.linear(x, weight, bias)
    del restored, absmax, weight
    return out


def _dequantize(shape: tuple[int, int], blocks: int, dtype: torch.dtype) -> torch.Tensor:
    """dequantize_4bit with double quantization: the fp32 absmax is restored first and freed once the
    16-bit weight exists."""
    absmax = _empty(blocks, torch.float32)
    weight = torch.empty(shape, dtype=dtype, device="meta")
    del absmax
    return weight


class Linear4bit(torch.nn.Linear):
    """bnb.nn.Linear4bit (NF4, double quantization, uint8 storage) in place of a loaded Linear or Conv1D.

    A subclass of nn.Linear so that peft adapts it as it adapts bitsandbytes' layer; `lora_clone` stands
    for peft's 4-bit LoRA layer, which clones the base output before adding the adapter's."""

    def __init__(self, base: torch.nn.Module, compute_dtype: torch.dtype):
        torch.nn.Module.__init__(self)
        if isinstance(base, torch.nn.Linear):
            self.in_features, self.out_features = base.in_features, base.out_features
        else:  # GPT-2's Conv1D keeps its weight as (in, out); transformers transposes it before quantizing
            self.in_features, self.out_features = base.weight.shape
        self.compute_dtype = compute_dtype
        self.lora_clone = False
        n = self.in_features * self.out_features
        self.blocks = math.ceil(n / NF4_BLOCK)
        loaded = torch.empty_like(base.weight)  # the checkpoint's 16-bit weight, copied to the GPU
        # quantize_4bit: fp32 absmax and the packed weight; then the absmax is re-quantized around its mean
        absmax = _empty(self.blocks, torch.float32)
        self.weight = torch.nn.Parameter(_empty(math.ceil(n / 2), torch.uint8).view(-1, 1), requires_grad=False)
        self.offset = _empty(1, torch.float32)  # not among the weights trainmem run counts (QuantState.offset)
        centred = torch.empty_like(absmax)
        self.register_buffer("nested_code", _empty(256, torch.float32), persistent=False)
        self.register_buffer("nested_absmax", _empty(math.ceil(self.blocks / NESTED_BLOCK), torch.float32),
                             persistent=False)
        self.register_buffer("absmax", _empty(self.blocks, torch.uint8), persistent=False)
        del centred, absmax
        self.register_buffer("code", _empty(16, torch.float32), persistent=False)
        del loaded
        self.bias = base.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # peft clones what the base layer returned, after the layer's compute-dtype copy of x is gone
        # (an H200 trace of a mistral-7b QLoRA run: that copy is freed before the clone's block; docs/lab)
        out = self._base(x)
        return out.clone() if self.lora_clone else out

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        return _MatMul4Bit.apply(x, bias, (self.out_features, self.in_features), self.blocks).to(dtype)


WARMUP_HEADROOM = int(1.2 * 2**30)
"""transformers keeps its warm-up allocation this far under the device's total memory."""


def warmup_bytes(model: torch.nn.Module, names: set[str], device_total: int | None = None) -> int:
    """Bytes of transformers' `caching_allocator_warmup` (5.x `modeling_utils`) before a 4-bit load: every
    state-dict tensor but the tied ones, at half a byte per element for the weights bitsandbytes quantizes
    and their own element size otherwise, capped at the device's total less 1.2 GiB. One allocation, freed
    at once, so the load then carves every weight out of that one cached segment; the holes the load's
    16-bit copies and peft's fp32 casts leave there are what a later large request cannot use (H200 traces
    of two QLoRA runs near a card's capacity, docs/lab)."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or ())
    total = 0.0
    for key, t in model.state_dict(keep_vars=True).items():
        owner, _, kind = key.rpartition(".")
        if key not in tied:
            total += t.numel() * (0.5 if owner in names and kind == "weight" else t.element_size())
    if device_total is not None:
        total = min(total, device_total - WARMUP_HEADROOM)
    return 2 * int(total // 2)


def load_4bit(model: torch.nn.Module, names: set[str], compute_dtype: torch.dtype,
              device_total: int | None = None) -> None:
    """Load `model` (built on the meta device before recording began) as transformers and bitsandbytes
    do: first the warm-up allocation (`warmup_bytes`, freed), then each tensor the load puts on the device
    is a fresh allocation, and the Linears in `names` turn into `Linear4bit`; then peft's cast of every other
    16-bit parameter to fp32 (all frozen). The load goes in the checkpoint's key order, which safetensors
    sorts by name (`lm_head` before `model.*`, `layers.10` before `layers.2`, as H200 traces of QLoRA loads
    show): where the 16-bit copies and embeddings sit in the warm-up segment decides which holes peft's
    fp32 casts leave next to each other (a llama-3.1-8b QLoRA run emulating an A5000, docs/lab)."""
    warmup = _empty(warmup_bytes(model, names, device_total) // 2, torch.float16)
    del warmup
    modules = dict(model.named_modules())
    for name, p in sorted(model.named_parameters(), key=lambda item: item[0]):
        owner, _, kind = name.rpartition(".")
        if owner in names and kind == "weight":
            parent, _, child = owner.rpartition(".")
            setattr(modules[parent] if parent else model, child, Linear4bit(modules[owner], compute_dtype))
        else:
            p.data = torch.empty_like(p)
    mark_quantized(model)
    kept = {id(m.bias) for m in model.modules() if isinstance(m, Linear4bit) and m.bias is not None}
    for p in model.parameters():
        # a 4-bit Linear's bias stays in the load dtype (measured on the H200: weights exact in every row)
        if p.dtype in (torch.float16, torch.bfloat16) and id(p) not in kept:
            p.data = p.data.to(torch.float32)
        p.requires_grad_(False)


def mark_quantized(model: torch.nn.Module) -> None:
    """What transformers' quantizer does after a 4-bit load (`quantizers/base.py` `_assign_is_quantized`): the
    config of every `PreTrainedModel` in the model says `_is_quantized`. Mamba mixers read it: Jamba's and
    Falcon-Mamba's then call their `dt_proj` as a layer (its 4-bit forward) instead of multiplying by its
    `weight`, which is packed uint8 once quantized (without the mark the simulation multiplied a uint8 weight by
    the activations). Mamba's own mixer has no such path (`config.specs.QLORA_REFUSED`)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.config._is_quantized = True


def qlora_model(base: torch.nn.Module, lora_config: Any, compute_dtype: torch.dtype, ledger: TensorLedger,
                device_total: int | None = None) -> Any:
    """`build.build_model`'s QLoRA path on the meta device, recorded by `ledger`: the 4-bit load, peft's
    casts and its `empty_cache`, then the adapters; the 4-bit layers with an adapter clone their output,
    as peft's bitsandbytes LoRA layer does."""
    from peft import get_peft_model

    from .states import quantizable

    load_4bit(base, quantizable(base), compute_dtype, device_total)
    ledger.empty_cache()
    with torch.device("meta"):
        model = get_peft_model(base, lora_config)
    for module in model.modules():
        layer = getattr(module, "base_layer", None)
        if isinstance(layer, Linear4bit) and hasattr(module, "lora_A"):
            layer.lora_clone = True
    return model


class AdamW8bit(torch.optim.Optimizer):
    """bitsandbytes' blockwise 8-bit AdamW: on a parameter's first step two uint8 states and an fp32 absmax
    per 256-element block each (32-bit states under 4096 elements), plus the two 256-entry quantile maps
    once; the update is one in-place kernel with no temporaries. `paged` states live in CUDA managed
    memory, outside the allocator, so the stand-in allocates nothing for them."""

    def __init__(self, params: Any, lr: float, paged: bool = False):
        super().__init__(params, {"lr": lr})
        self.paged = paged

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.state[p] or self.paged:
                    continue
                if not hasattr(self, "qmaps"):
                    # the signed and unsigned quantile maps, shared by every parameter; kept in the first
                    # parameter's state so that the state bytes count them, as states.optimizer does
                    self.qmaps = (_empty(256, torch.float32), _empty(256, torch.float32))
                    self.state[p]["qmap1"], self.state[p]["qmap2"] = self.qmaps
                n = p.numel()
                if n < QUANTIZED_MIN:
                    self.state[p].update(state1=torch.empty_like(p, dtype=torch.float32),
                                         state2=torch.empty_like(p, dtype=torch.float32))
                else:
                    blocks = math.ceil(n / 256)
                    self.state[p].update(state1=torch.empty_like(p, dtype=torch.uint8),
                                         state2=torch.empty_like(p, dtype=torch.uint8),
                                         absmax1=_empty(blocks, torch.float32), absmax2=_empty(blocks, torch.float32))
