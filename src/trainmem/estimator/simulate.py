"""The simulate method: the real Hugging Face model's training step on the meta device, tracked by the
same TensorLedger that `trainmem run` uses, so every tensor a forward, backward and optimizer step creates
is counted with no storage and no GPU.

CUDA-specific choices are modelled explicitly, because the meta device would otherwise take CPU paths:
- SDPA: a stand-in with the flash / memory-efficient kernels' memory (saves q, k, v, output and an fp32
  log-sum-exp; backward allocates the input gradients) instead of the math path's attention matrix,
  except for fp32 with grouped KV heads, which CUDA also runs on the math path;
- dropout keeps a 1-byte mask, as CUDA's fused kernel does (the CPU decomposition keeps a float mask);
- AdamW runs with `foreach=True`, the CUDA default, whose temporaries are part of the step peak.
The ledger records every allocation and free in order, so that `allocator.replay` can turn the step into
the caching allocator's reserved bytes.
Not modelled (the analytic method handles them): autocast (meta tensors take no autocast path) and
bitsandbytes (4-bit weights and 8-bit optimizers have no meta kernels).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..accumulation import micro_batch_loss
from ..measure import StateBytes, TensorLedger, state_bytes
from ..setup import TrainSetup

UNSUPPORTED = "simulate does not model autocast (amp-*), QLoRA or bitsandbytes optimizers"


def supports(setup: TrainSetup, precision: str) -> bool:
    return not (precision.startswith("amp") or setup.peft == "qlora" or "8bit" in setup.optimizer)


class _FlashSDPA(torch.autograd.Function):
    """Memory stand-in for the fused attention kernels: outputs of the right shape, the same saves."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # then one fp32 workspace, freed when the kernel ends: 4 * b * h * s * (D + 1) + 256 bytes, with s
        # and the head size D rounded up to 128 (H200 traces of GPT-NeoX, Llama and Qwen2, torch 2.11)
        b, h, s, d = q.shape
        s128, d128 = -(-s // 128) * 128, -(-d // 128) * 128
        workspace = q.new_empty((4 * b * h * s128 * (d128 + 1) + 256,), dtype=torch.uint8)
        del workspace
        return dq, dk, dv


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


_MATH_SDPA = torch.nn.functional.scaled_dot_product_attention


def _flash_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # CUDA's fused kernels: flash for half precision; memory-efficient for fp32, which does not take
    # grouped KV heads, so fp32 with GQA falls back to the math path (its attention matrix is saved)
    if query.dtype == torch.float32 and kwargs.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
        return _MATH_SDPA(query, key, value, *args, **kwargs)
    return _FlashSDPA.apply(query, key, value)


@contextlib.contextmanager
def cuda_choices(attention: str) -> Iterator[None]:
    """Patch what the meta device would do differently from CUDA, for the duration of a simulation."""
    import transformers.masking_utils as masking

    F = torch.nn.functional
    saved = (F.scaled_dot_product_attention, F.dropout, masking.find_packed_sequence_indices)
    try:
        if attention == "sdpa":
            F.scaled_dot_product_attention = _flash_sdpa
        F.dropout = _dropout
        # packed-sequence detection reads position ids on the host, which meta tensors cannot do
        masking.find_packed_sequence_indices = lambda *a, **k: None
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout, masking.find_packed_sequence_indices = saved


def cuda_kernel_temporaries(func: Any, args: tuple, out: Any) -> list[int]:
    """Buffers CUDA kernels allocate inside themselves, seen in H200 allocator traces (torch 2.11):
    the embedding backward's fp32 per-segment partial sums, (n // 10 + min(n, vocabulary)) rows of the
    hidden size for n token ids."""
    if func is torch.ops.aten.embedding_dense_backward.default:
        grad, indices, num_weights = args[0], args[1], args[2]
        n = indices.numel()
        return [4 * (n // 10 + min(n, num_weights)) * grad.shape[-1]]
    return []


def simulate_step(model: Any, setup: TrainSetup) -> tuple[TensorLedger, StateBytes]:
    """Two optimizer steps (states appear in the first) of the setup's accumulation on meta tensors."""
    from ..build import build_optimizer

    if setup.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if setup.optimizer.startswith("adamw"):
        # foreach is the CUDA default for AdamW; the fused kernel has no meta implementation and, like a
        # per-tensor loop, no step temporaries beyond one tensor's
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=setup.lr, foreach=setup.optimizer == "adamw")
    else:
        optimizer = build_optimizer(model, setup)
    ledger = TensorLedger(lambda: state_bytes(model, optimizer)).record()  # events for the allocator replay
    ledger.kernel_temporaries = cuda_kernel_temporaries
    ledger.adopt(list(model.parameters()) + list(model.buffers()))
    ids = torch.zeros((setup.batch_size, setup.seq_len), dtype=torch.long, device="meta")
    batch = {"input_ids": ids, "labels": ids}
    tokens = setup.grad_accum * setup.batch_size * (setup.seq_len - 1)
    final = StateBytes(0, 0, 0)
    with cuda_choices(setup.attention), ledger:
        for step in (1, 2):
            for k in range(1, setup.grad_accum + 1):
                ledger.set_phase(f"step{step}.micro{k}.forward")
                loss = micro_batch_loss(model, batch, tokens)
                ledger.set_phase(f"step{step}.micro{k}.backward")
                loss.backward()
                del loss
            ledger.set_phase(f"step{step}.optimizer")
            optimizer.step()
            final = state_bytes(model, optimizer)
            optimizer.zero_grad(set_to_none=True)
    return ledger, final
