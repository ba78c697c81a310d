"""The step-time model: predicted seconds per optimizer step of a setup on a card, with no GPU.

A step is `grad_accum` micro-steps (forward, backward, and under checkpointing a recomputed forward) and
one optimizer step. A micro-step costs a smooth maximum (`OVERLAP`) of two times, because the host launches
kernels asynchronously and the card runs them as they come (the loop syncs once per micro-batch, when it
counts the batch's tokens, so micro-steps do not overlap each other); the optimizer step the larger of two:

- the card's time: matmul FLOPs over the card's peak dense throughput for the matmul dtype times
  `EFF_MATMUL` or `EFF_FP32` (half-precision products with a dimension not a multiple of 8 counted
  `UNALIGNED_SLOWDOWN` times; or, where a micro-step has so few tokens that reading the weights takes longer,
  the weights' bytes: a roofline), attention's at `EFF_FLASH` or `EFF_EFFICIENT` by the kernel each call gets
  (in fp32 scaled by `EFF_ATTENTION_FP32`), plus the bytes that memory-bound kernels move over its bandwidth
  times `EFF_BANDWIDTH`: the bytes every non-matmul kernel of the step reads and writes, counted on the meta device
  (`kernels.count`: norms, activations, the loss, LoRA's dropout and scaling, autocast's and 4-bit Linears'
  casts, the math attention path's softmax), 4-bit dequantization, gradient accumulation and the optimizer
  update; bitsandbytes' 8-bit AdamW's bytes at its own, much lower, achieved bandwidth `EFF_8BIT`;
- the host's time: `HOST_PER_KERNEL` per kernel the step launches (counted on the same trace: forward,
  recompute, backward; autocast's casts are made in C++ and cost none), `QLORA_OPS` launches' worth per 4-bit
  Linear call for bitsandbytes' Python-level dequantize-and-matmul, and per-tensor optimizers' Python loop,
  `HOST_PER_TENSOR` per trainable tensor.

FLOPs per token (Kaplan et al. 2020; Narayanan et al. 2021, eq. 3): forward 2 per matmul weight; backward
twice the forward for weights that train (input and weight gradients), once for frozen ones (the input
gradient only: LoRA's and QLoRA's base); checkpointing adds one more forward of the decoder layers.
Attention's scores and values (4 s x width per token and layer, forward) are counted per call on the meta
trace with the kernel CUDA picks for that call (`kernels.Kernels.attention`): a fused kernel skips the masked
half of a causal product, but not under an explicit mask such as a sliding window's, which also rules flash
out (Gemma-2 beyond 4096 tokens, Gemma-3 beyond 512).
Offload (ZeRO/FSDP) adds its PCIe transfers; communication between GPUs is `comm.py`'s, added by the estimate.

The constants are fitted to the H200 step times committed in docs/lab/data (`benchmarks/time_validate.py fit`
on the rows of `lab/sets.json` timed over several steps; the fit and its
cross-validation: docs/time-model.md); every other card's time is derived from its catalog figures
(`gpus.SPEEDS`), which the result says.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.estimator.memory.states import Inventory, experts_per_token
from trainmem.hardware.gpus import GPU, Speed, speed_of

from . import kernels

# --- fitted on the H200 (benchmarks/time_validate.py fit; docs/time-model.md) ------------------------------
EFF_MATMUL = 0.6300
"""Achieved fraction of the card's peak dense half-precision (tensor-core) matmul throughput."""
EFF_FP32 = 0.7407
"""Achieved fraction of the card's peak plain-fp32 throughput in the weights' fp32 matmuls (CUDA cores, no TF32):
large, well-shaped products, unlike attention's (`EFF_ATTENTION_FP32`)."""
EFF_ATTENTION_FP32 = 0.4411
"""Achieved fraction of the card's peak plain-fp32 throughput in fp32 attention: the math path's batched
matmuls, whose inner dimension is the head's 64-128 (the scores) or whose operands are the s x s
probabilities, and the memory-efficient kernel's fp32 path. It runs in fp32 runs and under QLoRA, whose
4-bit Linears cast q, k and v back to the fp32 residual stream. Fitted apart from `EFF_FP32`: one figure for
both leaves the fp32 rows 5-32% too slow and the long QLoRA rows 14-26% too fast (docs/lab)."""
EFF_FLASH = 0.6197
"""Achieved fraction of peak of the flash attention kernel, forward and backward together. An effective figure,
not a kernel's: FlashAttention-2 reaches up to 225 of the A100's 312 dense TFLOPS but about 335 of the
H100's 989 (Dao 2023, arXiv 2307.08691), and the fit on the H200 rows lands far above the latter, so it
also absorbs what the model miscounts around attention at long sequences; refits of earlier model structures
put it anywhere between 0.37 and 0.74, so the H200 rows determine it weakly (docs/lab)."""
EFF_EFFICIENT = 0.5416
"""Achieved fraction of peak of the memory-efficient SDPA kernel (xformers' cutlass kernel) in half precision,
forward and backward together: what CUDA runs under an explicit mask (a sliding window's: Gemma-2 beyond 4096
tokens, Gemma-3 beyond 512, Mistral from 4096) or where a card has no flash. Fitted apart from `EFF_FLASH`.
In fp32 both fused kernels run at `EFF_ATTENTION_FP32`'s share of it."""
EFF_BANDWIDTH = 0.7089
"""Achieved fraction of the card's peak memory bandwidth in elementwise and optimizer kernels."""
HOST_PER_KERNEL = 31.04e-6
"""Host seconds per kernel launched (`kernels.count`): Python, the dispatcher and autograd around each."""
QLORA_OPS = 14.59
"""Kernel launches' worth of host time a bitsandbytes 4-bit Linear call costs beyond what the stand-in shows
(quantization state, dequantize, its Python autograd function)."""
HOST_PER_TENSOR = 74.09e-6
"""Host seconds per trainable tensor of a per-tensor optimizer step (bitsandbytes 8-bit, Adafactor)."""
EFF_8BIT = 0.07314
"""Achieved fraction of the card's peak bandwidth of bitsandbytes' blockwise 8-bit AdamW kernel over the
bytes it moves (`BYTES_8BIT`): each element's two states are dequantized through the 256-entry dynamic map
and re-quantized by searching it, with a per-block absmax reduction, so the kernel is bound by that work,
not by its few bytes (the 8B full-weight 8-bit rows take ~0.3 s per step in the update alone)."""
FITTED = ("EFF_MATMUL", "EFF_FP32", "EFF_ATTENTION_FP32", "EFF_FLASH", "EFF_EFFICIENT", "EFF_BANDWIDTH",
          "HOST_PER_KERNEL", "QLORA_OPS", "HOST_PER_TENSOR", "EFF_8BIT")

# --- derived, not fitted -------------------------------------------------------------------------------------
BYTES_8BIT = (3, 4)
"""8-bit AdamW per parameter: read the gradient and read/write the weight (3 x its bytes), read and write
two 1-byte states (4 bytes)."""
DEQUANT_BYTES = 4.5
"""Bytes per 4-bit weight per dequantization: 0.5 read, 2 written as half, 2 read back by the matmul."""
UNALIGNED_SLOWDOWN = {"Hopper": 5.9, "other": 2.0}
"""How many times longer a half-precision matmul with a dimension that is not a multiple of 8 takes than an
aligned one of the same FLOPs: cuBLAS cannot run it on its 16-byte-aligned tensor-core kernels (NVIDIA's
Matrix Multiplication Background guide: fp16 dimensions in multiples of 8; `resize_token_embeddings(
pad_to_multiple_of=...)` exists for it). Hopper (sm90 and later): 5.9, measured on the H200 with
`benchmarks/matmul_alignment.py` (GPT-2's head at 16384 tokens, its forward, input and weight gradients:
5.8x per FLOP in bf16 and 5.9x in fp16 at 50257 against 50264; docs/lab/data/matmul-alignment-h200-2026-12-05.json);
its fast kernels load tiles with the tensor memory accelerator, which needs the alignment. Other cards: 2.0,
derived, not measured: nanoGPT pads GPT-2's 50257-token vocabulary to 50304 "for efficiency", which its
author reported as about 25% faster training on A100s; the head is 29% of GPT-2 small's matmul FLOPs at 1024
tokens, so 0.71 + 0.29 x slowdown = 1.25 gives about 1.9."""
OVERLAP = 2
"""The card and the host work at once, but not perfectly: a micro-step takes the 2-norm of their times (a
smooth maximum; fixed, not fitted: the 2-norm fits the H200 rows better than the maximum or the 4-norm)."""
STEP_FIXED_S = 1e-3
"""Host seconds per step outside the layers: batch to device, the per-micro-batch sync, loss, zero_grad."""


@dataclass(frozen=True)
class Workload:
    """What one optimizer step does, counted from the model's parameter inventory: card-independent."""

    tokens: int
    """Tokens per optimizer step on one GPU (micro-batch x sequence x accumulation)."""
    micro_steps: int
    flops: dict[str, float]
    """Matmul FLOPs per micro-step: forward, backward, recompute, attention; and `unaligned`, the part of the
    first three in half-precision matmuls with a dimension not a multiple of 8 (`UNALIGNED_SLOWDOWN`); and `fp32`,
    the products that run in fp32 beside half ones (fp32 experts under autocast or QLoRA, QLoRA's unquantized
    layers), forward, backward and recompute together."""
    half: bool
    """Weight matmuls run in fp16/bf16 (pure half, autocast, QLoRA's compute dtype), else fp32."""
    attention: dict[str, float]
    """Attention's FLOPs per micro-step by the kernel and precision that run them (`kernels.Kernels.attention`:
    `flash-half`, `efficient-half`, `efficient-fp32`, `math-half`, `math-fp32`); their sum is `flops`'s."""
    micro_bytes: dict[str, float]
    """Bytes moved by memory-bound kernels per micro-step, by cause."""
    step_bytes: dict[str, float]
    """Bytes moved once per optimizer step (the optimizer update)."""
    pcie_bytes: float
    """Bytes over the host link per step (offload)."""
    launches: float
    """Kernels launched per micro-step (`kernels.count`: forward, recompute, backward)."""
    quant_calls: float
    """Calls of 4-bit Linears per micro-step (each costs `QLORA_OPS` more launches' worth of host time)."""
    step_ops: float
    """Host-side launches of a per-tensor optimizer step."""
    step_bytes_8bit: float = 0.0
    """Bytes moved by a bitsandbytes 8-bit optimizer step (run at `EFF_8BIT` of the bandwidth)."""

    @property
    def model_flops(self) -> float:
        """FLOPs per step that train the model (recompute excluded), for MFU."""
        f = self.flops
        return self.micro_steps * (f["forward"] + f["backward"] + f.get("fp32", 0.0)
                                   + f["attention"] * 3 / (3 + bool(f["recompute"])))


@dataclass(frozen=True)
class StepTime:
    step_s: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs per second (recompute excluded) over the card's peak dense throughput for the dtype."""
    parts: dict[str, float] = field(default_factory=dict)
    """Seconds per step by part: compute, memory, host (the larger of card and host counts per micro-step)."""
    card: str = ""
    derived: bool = True
    """True where the card's time comes from its catalog figures rather than its own measurements."""
    micro_s: float = 0.0
    """Seconds of one micro-step (forward, backward and recompute): what communication overlaps (`comm.py`)."""

    def to_dict(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "parts": dict(self.parts), "card": self.card, "derived": self.derived}


def _structure(model: Any) -> tuple[Any, set[str], str | None]:
    """The base model, the names of embedding parameters (lookups, not matmuls) and the name of the output
    head's weight when it is a parameter of its own (None when tied); read once per inspected model
    (`_STRUCTURES`), which the every-card table counts once per card."""
    known = _STRUCTURES.get(model)
    if known is None:
        known = _STRUCTURES[model] = _read_structure(model)
    return known


_STRUCTURES: weakref.WeakKeyDictionary[Any, tuple[Any, set[str], str | None]] = weakref.WeakKeyDictionary()


def _read_structure(model: Any) -> tuple[Any, set[str], str | None]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = {id(p): n for n, p in model.named_parameters()}
    embeddings = {names[id(p)] for m in model.modules() if isinstance(m, torch.nn.Embedding)
                  for p in m.parameters(recurse=False) if id(p) in names}
    head = base.get_output_embeddings()
    head_name = names.get(id(head.weight)) if head is not None else None
    return base, embeddings, None if head_name in embeddings else head_name


def workload(spec: ModelSpec, inv: Inventory, setup: TrainSetup, precision: str, card: GPU) -> Workload:
    """Count one step of `setup` on `spec`'s model, whose parameters `inv` lists (see the module docstring)."""
    base, embeddings, head_name = _structure(inv.model)
    cfg = base.config.get_text_config(decoder=True)  # a composite config's language model
    hidden = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
    vocab = int(cfg.vocab_size)
    b, s, accum = setup.batch_size, setup.seq_len, setup.grad_accum
    tokens = b * s
    ck = 1 if setup.checkpointing else 0
    block_frozen = block_train = 0
    head_params, head_train = vocab * hidden, False
    quantized = 0
    experts_frozen = experts_train = 0.0
    # peft's prepare_model_for_kbit_training casts every 16-bit weight bitsandbytes did not quantize to fp32:
    # a Linear subclass (Falcon's FalconLinear) then multiplies fp32 activations by fp32 weights
    qlora_fp32 = setup.peft == "qlora" and precision != "fp32"
    fp32_frozen = 0
    train_elems: list[tuple[int, float]] = []
    for p in inv.params:
        if p.trainable:
            train_elems.append((p.numel, p.bytes_per))
        if len(p.shape) == 3:  # a mixture of experts' fused weights: each token runs top-k of the experts
            share = p.numel * _active_share(cfg, p.shape[0])
            experts_train += share if p.trainable else 0.0
            experts_frozen += 0.0 if p.trainable else share
            continue
        if len(p.shape) != 2 or p.name in embeddings:
            continue
        if p.name == head_name:
            head_params, head_train = p.numel, p.trainable
            continue
        quantized += p.numel if p.quantized else 0
        if qlora_fp32 and not p.trainable and not p.quantized and p.bytes_per == 4:
            fp32_frozen += p.numel  # a layer bitsandbytes left alone, cast to fp32 by peft
        elif p.trainable:
            block_train += p.numel
        else:
            block_frozen += p.numel
    if head_name is None:  # tied: the head is the input embedding, trainable with it
        head_train = any(p.trainable for p in inv.params if p.name in embeddings)
    # transformers casts the experts' input to their weights' dtype (grouped products are not autocast), so
    # fp32 experts (autocast over fp32 weights, QLoRA's fp32 casts) multiply in fp32 while the rest is half
    fp32_experts = precision.startswith("amp") or setup.peft == "qlora"
    expert_flops = tokens * (2 * (experts_frozen + experts_train) + 2 * experts_frozen + 4 * experts_train
                             + ck * 2 * (experts_frozen + experts_train))
    if not fp32_experts:
        block_frozen += experts_frozen
        block_train += experts_train
    fwd = 2 * (block_frozen + block_train) + 2 * head_params
    bwd = 2 * block_frozen + 4 * block_train + (4 if head_train else 2) * head_params
    rec = ck * 2 * (block_frozen + block_train)
    fp32_flops = tokens * (2 + 2 + ck * 2) * fp32_frozen + (expert_flops if fp32_experts else 0.0)
    flops = {"forward": tokens * fwd, "backward": tokens * bwd, "recompute": tokens * rec, "fp32": fp32_flops}
    counted = kernels.count(spec, setup, precision, card)
    attention = counted.attention(b)  # counted per call, with the kernel CUDA picks for it
    flops["attention"] = sum(attention.values())
    flops["unaligned"] = counted.unaligned(b)  # part of forward, backward and recompute
    half = precision != "fp32" or setup.peft == "qlora"
    # every expert's weights are read each pass: a batch of many tokens routes some to each of them
    weight_bytes = sum(p.numel * p.bytes_per for p in inv.params
                       if len(p.shape) in (2, 3) and p.name not in embeddings and not p.quantized)
    weight_bytes += 0 if head_name else head_params * (2 if precision in ("fp16", "bf16") else 4)
    micro_bytes = {
        # every kernel that is not a matrix product: norms, activations, the loss, LoRA's, autocast's casts
        "kernels": counted.bytes(b),
        "dequantize": DEQUANT_BYTES * quantized * (2 + ck),
        # every matmul reads its half (or fp32) weight once per pass; weights that train also write a gradient
        "weights": (weight_bytes * (1 + 2 + ck) + sum(n * d for n, d in train_elems if n > 1)),
        "grad_accumulate": (3.0 * sum(n * d for n, d in train_elems)) if accum > 1 else 0.0,
    }
    update = update_8bit = 0.0
    row = OPTIMIZERS[setup.optimizer]  # its passes and host launches per tensor (config/optimizers.py)
    if row.eight_bit:
        update_8bit = sum(BYTES_8BIT[0] * n * d + BYTES_8BIT[1] * n for n, d in train_elems)
    else:
        update = row.passes * sum(n * d for n, d in train_elems)
    gpus = max(setup.shard_group, 1)  # HSDP: each rank updates its node's shard
    if setup.shard in ("zero1", "zero2", "zero3", "fsdp"):
        update, update_8bit = update / gpus, update_8bit / gpus  # each rank updates its shard
    pcie = 0.0
    if setup.offload != "none":
        # gradients go to the host and updated half weights come back, per rank's shard
        pcie = sum(n * 2 * 2 for n, _ in train_elems) / gpus
        if setup.offload == "params":
            pcie += sum(p.numel * 2 for p in inv.params) / gpus * (2 + ck)

    quant_calls = sum(1 for p in inv.params if p.quantized) * (2 + ck)
    step_ops = row.per_tensor * len(train_elems)
    return Workload(tokens * accum, accum, flops, half, attention, micro_bytes, {"optimizer": update}, pcie,
                    counted.launches, quant_calls, step_ops, update_8bit)


def _active_share(cfg: Any, experts: int) -> float:
    """The fraction of a fused expert weight (`experts` x out x in) one token's products run: top-k of the
    experts. Where the config names no top-k, every expert counts (an upper bound)."""
    k = experts_per_token(cfg)
    return min(k, experts) / experts if k else 1.0



def step_time(work: Workload, card: GPU, speed: Speed | None = None, tf32: bool = False) -> StepTime | None:
    """Seconds per optimizer step of `work` on `card`; None where the catalog has no speed figures."""
    speed = speed or speed_of(card)
    if speed is None:
        return None
    def peak(half: bool) -> float:
        fp32 = speed.tf32_tflops if tf32 and speed.tf32_tflops else speed.fp32_tflops
        return 1e12 * (speed.half_tflops if half else fp32)

    bandwidth = 1e9 * speed.bandwidth_gbs * EFF_BANDWIDTH
    f = work.flops
    def eff(half: bool) -> float:
        return EFF_MATMUL if half else EFF_FP32

    def attention_rate(kernel: str) -> float:
        name, precision = kernel.split("-")
        eff = {"flash": EFF_FLASH, "efficient": EFF_EFFICIENT}.get(name, EFF_MATMUL)
        if precision == "fp32":  # fp32 attention runs on CUDA cores, fused or not
            eff *= EFF_ATTENTION_FP32 / EFF_MATMUL
        return peak(precision == "half") * eff

    slowdown = UNALIGNED_SLOWDOWN["Hopper" if card.sm >= (9, 0) else "other"]
    matmul = ((f["forward"] + f["backward"] + f["recompute"] + (slowdown - 1) * f.get("unaligned", 0.0))
              / (peak(work.half) * eff(work.half)) + f.get("fp32", 0.0) / (peak(False) * EFF_FP32))
    # a matmul reads its weight while it computes: the weights' bytes only count where they take longer
    # than the matmuls' FLOPs (few tokens per micro-step), a roofline over the weight matmuls
    matmul = max(matmul, work.micro_bytes["weights"] / bandwidth)
    compute = matmul + sum(n / attention_rate(k) for k, n in work.attention.items())
    memory = sum(v for k, v in work.micro_bytes.items() if k != "weights") / bandwidth
    host = (work.launches + QLORA_OPS * work.quant_calls) * HOST_PER_KERNEL
    # a smooth maximum: where the two are close, launches still leave gaps on the card
    micro = ((compute + memory) ** OVERLAP + host ** OVERLAP) ** (1 / OVERLAP)
    opt_card = (work.step_bytes["optimizer"] / bandwidth
                + work.step_bytes_8bit / (1e9 * speed.bandwidth_gbs * EFF_8BIT))
    opt_host = work.step_ops * HOST_PER_TENSOR
    pcie = work.pcie_bytes / (1e9 * speed.pcie_gbs)
    step = work.micro_steps * micro + max(opt_card, opt_host) + pcie + STEP_FIXED_S
    parts = {"compute": work.micro_steps * compute, "memory": work.micro_steps * memory + opt_card,
             "host": work.micro_steps * host + opt_host, "pcie": pcie}
    return StepTime(step, work.tokens / step, work.model_flops / (step * peak(work.half)), parts, card.name,
                    derived=not card.measured, micro_s=micro)


__all__ = ["Workload", "StepTime", "workload", "step_time", "FITTED"]
