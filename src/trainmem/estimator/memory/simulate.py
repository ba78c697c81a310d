"""The simulate method: the real Hugging Face model's training step on the meta device, tracked by the
same TensorLedger that `trainmem run` uses, so every tensor a forward, backward and optimizer step creates
is counted with no storage and no GPU.

CUDA-specific choices are modelled explicitly, because the meta device would otherwise take CPU paths:
- SDPA: a stand-in with the flash / memory-efficient kernels' memory (saves q, k, v, output and an fp32
  log-sum-exp; backward allocates the input gradients) instead of the math path's attention matrix,
  except for fp32 with grouped KV heads, which CUDA also runs on the math path;
- dropout keeps a 1-byte mask, as CUDA's fused kernel does (the CPU decomposition keeps a float mask);
- AdamW runs with `foreach=True`, the CUDA default, whose temporaries are part of the step peak;
- each cuBLAS handle allocates its workspace on its first matrix product: the forward thread's in the
  first forward, autograd's in the first backward.
The ledger records every allocation and free in order, from the model's construction on (a tied output
head is allocated and freed there, as on the GPU), so that `allocator.replay` can turn the run into the
caching allocator's reserved bytes as a fresh `trainmem run` process would see them.
bitsandbytes has no meta kernels: `quantized.py` holds stand-ins with its allocations (QLoRA's 4-bit
load and layers, 8-bit AdamW). Autocast (`amp-*`), which meta tensors do not take, runs through
`autocast.CudaAutocast`, CUDA's cast policy applied by a function mode around each forward.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.hardware import cuda
from trainmem.hardware.gpus import GPU
from trainmem.measure.accumulation import micro_batch_loss
from trainmem.measure.ledger import StateBytes, TensorLedger, state_bytes
from trainmem.measure.train import PROBE_STEPS

from . import autocast, quantized, states
from .inplace import InPlace
from .hostvalues import HostValues


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
             PreTrainedModel.warn_if_padding_and_no_attention_mask)
    try:
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
         torch._grouped_mm, PreTrainedModel.warn_if_padding_and_no_attention_mask) = saved


_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default}


class CudaKernels:
    """What CUDA kernels allocate that no dispatch shows, seen in H200 allocator traces (torch 2.11):
    - temporaries: the embedding backward's fp32 per-segment partial sums, (n // 10 + min(n, vocabulary))
      rows of the hidden size for n token ids; the fp32 softmax backward over attention probabilities
      (4-D: the math SDPA path, eager attention) allocates one more buffer of its output's size, freed
      before it returns (H200 trace of mistral-7b QLoRA b4 s2048, docs/lab: four 2 GiB buffers live at
      the peak where the meta decomposition has three);
    - the math SDPA path's `_safe_softmax` (one operator to a dispatch mode) allocates, after its output, a
      boolean copy of its input's `== -inf` test and the per-row reduction of it, freed before it returns
      (H200 trace of llama-3.2-3b QLoRA b4 s2496, docs/lab: a 570 MiB block per layer beside the 2.2 GiB
      probabilities, which the meta run lacked);
    - each cuBLAS handle's workspace (`cuda.cublas_workspace`, `cuda.CUBLAS_HANDLES`), held from the
      handle's first matrix product on: the forward thread's and autograd's backward thread's."""

    def __init__(self, ledger: TensorLedger, workspace: int = cuda.cublas_workspace((9, 0))):
        self.ledger = ledger
        self.workspace = workspace
        self.handles: set[str] = set()

    def __call__(self, func: Any, args: tuple, out: Any) -> list[int]:
        if func in _MATMULS:
            thread = "backward" if self.ledger.phase.endswith("backward") else "forward"
            if thread not in self.handles:
                self.handles.add(thread)
                self.ledger.hold(self.workspace)
        if func is torch.ops.aten._softmax_backward_data.default and out.dim() == 4 and out.dtype == torch.float32:
            return [out.untyped_storage().nbytes()]
        if func is torch.ops.aten._safe_softmax.default:
            return [out.numel(), out.numel() // max(out.shape[-1], 1)]
        if func is torch.ops.aten.embedding_dense_backward.default:
            grad, indices, num_weights = args[0], args[1], args[2]
            n = indices.numel()
            return [4 * (n // 10 + min(n, num_weights)) * grad.shape[-1]]
        return []


STEPS = 3
"""Optimizer steps simulated: the states appear in the first, the second is the first steady one, and the
third starts from the blocks the second left, as `trainmem run`'s default three steps do. Two are not
enough: a Qwen3 amp-fp16 run emulating a T4 ran out of memory in its third step (docs/lab), which a replay
of two steps cannot show. The first `train.PROBE_STEPS` run ATen's in-place adds out of place,
as `trainmem run`'s probed steps do; the later ones, which the replay repeats, in place, as a user's run does
(`inplace`)."""


class SimulatedLedger(TensorLedger):
    """The recording ledger with the in-place adds its own dispatch mode would turn off put back (`inplace`)."""

    def __init__(self, state: Callable[[], StateBytes]):
        super().__init__(state)
        self.inplace = InPlace()
        self.balanced_routing = False
        """Whether the step's host reads needed the balanced-routing assumption (`hostvalues.ROUTING_BALANCED`)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        done = self.inplace.add(func, args)
        return done if done is not None else super().__torch_dispatch__(func, types, args, kwargs)


def model_builder(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU) -> Callable[[TensorLedger], Any]:
    """How simulate builds the model, recorded as `trainmem run` builds it on the GPU: constructed on the
    device; under QLoRA constructed, saved and freed unrecorded (`build.build_model` empties the cache and
    resets the peaks after it), then loaded 4-bit, cast by peft, cache emptied, adapters added."""
    if setup.peft != "qlora":
        return lambda ledger: states.meta_model(spec, setup, precision)
    from trainmem.measure.build import AUTOCAST_DTYPES, WEIGHT_DTYPES, lora_config

    base = states.meta_model(spec, setup.replace(peft="none"), precision)  # built before recording starts
    dtype = WEIGHT_DTYPES[precision]
    compute = dtype if dtype != torch.float32 else AUTOCAST_DTYPES.get(precision, torch.float32)
    return lambda ledger: quantized.qlora_model(base, lora_config(setup), compute, ledger, card.capacity)


def train_mode(model: Any, setup: TrainSetup, amp: torch.dtype | None) -> None:
    """Training mode as `trainmem run` sets it: checkpointing non-reentrant where asked (its recompute under
    the forward's autocast), dropout on."""
    if setup.checkpointing:
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if amp is not None:
            kwargs["context_fn"] = autocast.recompute_context(amp)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()


def steady_start(ledger: TensorLedger) -> int | None:
    """Where in a recording ledger's events the last simulated step begins: the steady step the allocator
    replay repeats (`allocator.replay_steps`)."""
    return ledger.marks.get(f"step{STEPS}.micro1.forward")


def simulate_step(build: Callable[[TensorLedger], Any], setup: TrainSetup,
                  precision: str | None = None,
                  workspace: int = cuda.cublas_workspace((9, 0)),
                  flash: bool = True, device: str = "meta",
                  follow: Callable[[TensorLedger], Any] | None = None) -> tuple[TensorLedger, StateBytes]:
    """Build the model with `build` (on the meta device, given the ledger for what no operator shows),
    then `STEPS` optimizer steps (states appear in the first) of the setup's accumulation, all under one
    recording ledger. Under `amp-*` each forward (loss included, as `train.train` does) runs in an
    autocast region. `workspace`: bytes per cuBLAS handle; `flash`: the card has the flash kernel. A
    sharded simulation (`sharded.py`) passes `device="cpu"` (fake CPU tensors) and `follow`, the context
    that routes FSDP2's storage resizes through the ledger."""
    from trainmem.measure.build import AUTOCAST_DTYPES

    amp = AUTOCAST_DTYPES.get(precision or setup.precision)

    held: dict[str, Any] = {"model": None, "optimizer": None}

    def states() -> StateBytes:
        if held["model"] is None:
            return StateBytes(0, 0, 0)
        return state_bytes(held["model"], held["optimizer"])

    ledger = SimulatedLedger(states).record()  # events for the allocator replay
    ledger.kernels = CudaKernels(ledger, workspace)
    ledger.set_phase("build")
    with contextlib.ExitStack() as stack:
        if follow is not None:
            stack.enter_context(follow(ledger))
        return _steps(build, setup, amp, ledger, device, held, flash)


def _steps(build: Callable[[TensorLedger], Any], setup: TrainSetup, amp: Any, ledger: SimulatedLedger,
           device: str, held: dict[str, Any], flash: bool) -> tuple[TensorLedger, StateBytes]:
    from trainmem.measure.build import build_optimizer

    with ledger:
        held["model"] = model = build(ledger)
    ledger.adopt(list(model.parameters()) + list(model.buffers()))  # any the build did not create itself
    train_mode(model, setup, amp)
    params = [p for p in model.parameters() if p.requires_grad]
    if setup.optimizer in ("adamw", "adamw-fused"):
        # foreach is the CUDA default for AdamW; the fused kernel has no meta implementation and, like a
        # per-tensor loop, no step temporaries beyond one tensor's
        optimizer = torch.optim.AdamW(params, lr=setup.lr, foreach=setup.optimizer == "adamw")
    elif setup.optimizer.endswith("adamw-8bit"):
        optimizer = quantized.AdamW8bit(params, lr=setup.lr, paged=setup.optimizer.startswith("paged"))
    else:
        optimizer = build_optimizer(model, setup)
    held["optimizer"] = optimizer
    ids = torch.zeros((setup.batch_size, setup.seq_len), dtype=torch.long, device=device)
    batch = {"input_ids": ids, "labels": ids}
    tokens = setup.grad_accum * setup.batch_size * (setup.seq_len - 1)
    final = StateBytes(0, 0, 0)
    with cuda_choices(setup.attention, flash, ledger.inplace, zeros=(ids,)) as host, ledger:
        for step in range(1, STEPS + 1):
            ledger.inplace.enabled = step > PROBE_STEPS
            for k in range(1, setup.grad_accum + 1):
                ledger.set_phase(f"step{step}.micro{k}.forward")
                with autocast.region(amp):
                    loss = micro_batch_loss(model, batch, tokens)
                ledger.set_phase(f"step{step}.micro{k}.backward")
                if ledger.inplace.enabled:
                    ledger.inplace.watch(loss.grad_fn)
                loss.backward()
                del loss
            ledger.set_phase(f"step{step}.optimizer")
            optimizer.step()
            final = state_bytes(model, optimizer)
            optimizer.zero_grad(set_to_none=True)
    ledger.balanced_routing = host.balanced
    return ledger, final
