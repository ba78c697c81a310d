"""TRL's fused LM head (`--engine sft`, and an SFTConfig given as `--training-args`) on the meta device: a
stand-in with the allocations and saves of TRL 1.16's sources, patched into a built model as `SFTTrainer`
patches it (`add_fused_lm_head(model.get_base_model() if peft else model, outputs=("log_probs", "entropy",
"is_top1"))`), so that no TRL is needed where the estimate runs.

SFTTrainer always trains through this head (`SFTTrainer.compute_loss` calls the model with `fused_lm_head=True`;
only `label_smoothing_factor`, a `compute_loss_func` or `loss_type` other than nll/dft leave it, and
`use_liger_kernel` turns Liger's own fused cross-entropy off for it), and no config field turns it off.

- `trl/trainer/utils.py` `add_fused_lm_head._fused_forward`: the backbone's last hidden state and the labels
  shifted by one; `mask = labels != -100`; on a Triton device (CUDA) only the labelled positions are scored
  (`hidden_states[mask]`, `labels[mask]`: copies of N rows); the per-token results scattered back to
  (batch, seq_len - 1) with `new_zeros(...).masked_scatter(mask, x)`;
- `trl/kernels/chunked_logprob.py` `ChunkedLogProbFunction`: the projection in (4096 tokens x 32768 vocabulary)
  tiles of one buffer in the compute dtype (`mm_buf`, allocated at that width even when the vocabulary is
  smaller), folded by a Triton kernel (no memory of its own) into seven fp32 per-token statistics; saves the
  N hidden rows, the head's weight, the N targets, `log_z` and the entropy (fp32, N each). Backward recomputes
  each tile into a second `mm_buf` and accumulates the hidden rows' and, where the head trains, the head's
  gradients in fp32 (`torch.zeros`), cast to their inputs' dtypes at the end.
The whole (batch, seq_len, vocabulary) logits never exist. The simulated batch has no ignored label, so N is
batch x (seq_len - 1); padded `--data` rows score fewer, which makes this an upper bound there.
"""

from __future__ import annotations

import contextlib
from types import MethodType
from typing import Any, Iterator

import torch

from . import autocast

TRL_VERSION = "1.16"
VOCAB_CHUNK = 32768
"""`_CHUNKED_LOGPROB_CHUNK_SIZE` (trl/trainer/utils.py): the vocabulary columns of one tile."""
TOKEN_CHUNK = 4096
"""`TOKEN_CHUNK_SIZE` (trl/kernels/chunked_logprob.py): the token rows of one tile."""
STATISTICS = 7
"""Per-token fp32 vectors the forward folds into: running max, sum of exponentials, its entropy, square and
mean-logit sums, the max before the target, the target's logit (`ChunkedLogProbFunction.forward`)."""
NOTE = (f"--engine sft: TRL's SFTTrainer trains through its fused LM head (no full logits), priced from TRL "
        f"{TRL_VERSION}'s sources (add_fused_lm_head, ChunkedLogProbFunction)")
"""Said on every simulated estimate of a setup SFTTrainer trains."""
ANALYTIC_NOTE = ("--engine sft: the analytic method prices transformers' full logits, not TRL's fused LM head "
                 "(an upper bound on the loss's part)")
"""Said where the analytic method priced such a setup (DDP, ZeRO, offload, or a model the simulation cannot run)."""


def buffer_bytes(tokens: int, compute_dtype: torch.dtype) -> int:
    """Bytes of one `mm_buf`, the head's tile buffer: (min(tokens, 4096) x 32768) in the compute dtype."""
    return min(tokens, TOKEN_CHUNK) * VOCAB_CHUNK * torch.empty((), dtype=compute_dtype).element_size()


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The autocast dtype where autocast is on, else the hidden states' (`ChunkedLogProbFunction.forward`)."""
    region = autocast.active()
    return region.dtype if region is not None else hidden.dtype


class ChunkedLogProb(torch.autograd.Function):
    """`ChunkedLogProbFunction` with outputs ("log_probs", "entropy", "is_top1"), on CUDA (Triton folds)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> Any:
        ctx.set_materialize_grads(False)
        n, vocab = hidden.shape[0], weight.shape[0]
        compute = _compute_dtype(hidden)
        stats = [hidden.new_empty((n,), dtype=torch.float32) for _ in range(STATISTICS)]
        running_max, sum_exp, x_sum_exp, _, _, max_before_target, target_logit = stats
        mm_buf = hidden.new_empty((min(n, TOKEN_CHUNK), VOCAB_CHUNK), dtype=compute)
        for start in range(0, n, TOKEN_CHUNK):
            chunk = hidden[start:start + TOKEN_CHUNK].to(compute)  # a copy where the dtypes differ
            for v in range(0, vocab, VOCAB_CHUNK):
                w = weight[v:v + VOCAB_CHUNK].to(compute)
                del w  # torch.mm(out=tile): into mm_buf, nothing new
            del chunk
        del mm_buf
        log_z = running_max + torch.log(sum_exp)
        logprobs = target_logit - log_z
        entropy = log_z - x_sum_exp / sum_exp
        is_top1 = (target_logit >= running_max) & (target_logit > max_before_target)
        del stats, running_max, sum_exp, x_sum_exp, max_before_target, target_logit
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        ctx.compute = compute
        ctx.mark_non_differentiable(is_top1)
        return logprobs, entropy, is_top1

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Any, grad_entropy: Any, *_: Any) -> tuple[Any, ...]:
        hidden, weight, _, _, _ = ctx.saved_tensors
        compute = ctx.compute
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) \
            if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        mm_buf = hidden.new_empty((min(n, TOKEN_CHUNK), VOCAB_CHUNK), dtype=compute)
        if grad_logprobs is not None:
            grad_logprobs = grad_logprobs.float().contiguous()
        if grad_entropy is not None:
            grad_entropy = grad_entropy.float().contiguous()
        half = compute in (torch.float16, torch.bfloat16)
        for start in range(0, n, TOKEN_CHUNK):
            chunk = hidden[start:start + TOKEN_CHUNK].to(compute)
            for v in range(0, vocab, VOCAB_CHUNK):
                w = weight[v:v + VOCAB_CHUNK].to(compute)
                # `_addmm_fp32`: CUDA's addmm(out_dtype=float32) from half inputs allocates nothing; otherwise
                # `acc.addmm_(a.float(), b.float())` (no copy of an fp32 tile)
                if not half:
                    extra = [w.float()] if grad_hidden is not None else []
                    extra += [chunk.float()] if grad_weight is not None else []
                    del extra
                del w
            del chunk
        del mm_buf
        out_hidden = grad_hidden.to(hidden.dtype) if grad_hidden is not None else None
        out_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        del grad_hidden, grad_weight
        return out_hidden, out_weight, None


class _Compact(torch.autograd.Function):
    """`x[mask]` for a boolean mask over x's leading dims with every position set (the simulated batch): the
    `nonzero` indices (count x dims, int64) made and dropped, the rows copied; saves the mask, whose backward
    scatters into zeros of x's shape (`index_backward`, `index_put_(accumulate=True)`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = mask.numel()
        indices = torch.empty((rows, mask.dim()), dtype=torch.long, device=x.device)
        out = x.new_empty((rows, *x.shape[mask.dim():]))
        del indices
        ctx.save_for_backward(mask)
        ctx.shape = x.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        (mask,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.shape)
        indices = torch.empty((mask.numel(), mask.dim()), dtype=torch.long, device=grad.device)
        del indices
        return out, None


class _Scatter(torch.autograd.Function):
    """`x.new_zeros(mask.shape).masked_scatter(mask, x)`: zeros, then the scattered copy; backward
    `masked_select`s the gradient's N values (`masked_scatter_backward`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        zeros = x.new_zeros(mask.shape)
        out = torch.empty_like(zeros)
        del zeros
        ctx.rows = x.shape[0]
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        return grad.new_empty((ctx.rows,)), None


def _fused_forward(self: Any, input_ids: Any = None, attention_mask: Any = None, labels: Any = None,
                   num_items_in_batch: Any = None, **kwargs: Any) -> Any:
    """`_fused_forward` with `fused_lm_head=True` on CUDA, then `SFTTrainer.compute_loss`'s nll: the loss is the
    negated log-probabilities' sum over `num_items_in_batch`."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs["use_cache"] = False
    outputs = self.base_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    hidden_states = outputs.last_hidden_state[:, :-1]
    del outputs
    shifted = labels[:, 1:]
    mask = shifted != -100
    weight = self.get_output_embeddings().weight
    if hasattr(weight, "full_tensor"):  # FSDP2's DTensor: gathered once, as TRL does
        weight = weight.full_tensor()
    hidden = _Compact.apply(hidden_states, mask)
    targets = shifted.new_empty((mask.numel(),))  # labels[mask]
    log_probs, entropy, is_top1 = ChunkedLogProb.apply(hidden, weight, targets)
    del hidden, hidden_states, targets
    log_probs, entropy, is_top1 = (_Scatter.apply(x, mask) for x in (log_probs, entropy, is_top1))
    items = mask.sum() if num_items_in_batch is None else num_items_in_batch
    own = -log_probs.sum() / items  # the head's own `loss`, which compute_loss does not use
    del own
    per_token = -log_probs
    loss = per_token.sum() / torch.as_tensor(items, device=per_token.device).clamp(min=1)
    del per_token, log_probs, entropy, is_top1, mask
    return CausalLMOutputWithPast(loss=loss, logits=None)


@contextlib.contextmanager
def patched(model: torch.nn.Module) -> Iterator[None]:
    """The model with TRL's fused LM head as its training forward (a LoRA model: its base model's, as SFTTrainer
    patches it), for the duration."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        base.forward = MethodType(_fused_forward, base)
        yield
    finally:
        base.__dict__.pop("forward", None)


__all__ = ["ChunkedLogProb", "patched", "buffer_bytes", "NOTE", "ANALYTIC_NOTE", "TRL_VERSION", "VOCAB_CHUNK", "TOKEN_CHUNK"]
