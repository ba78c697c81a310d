"""The simulated CUDA autocast: CUDA's cast policy on meta tensors, its weight cache, and its memory."""

from __future__ import annotations

import torch

from trainmem import ModelSpec, TrainSetup, estimate
from trainmem.estimator.memory.autocast import CudaAutocast

BF16 = torch.bfloat16


def _meta(*shape, requires_grad=False):
    return torch.empty(shape, device="meta", requires_grad=requires_grad)


def test_lower_precision_fp32_and_set_opt_dtype_ops():
    x = _meta(4, 8, requires_grad=True)
    w = torch.nn.Parameter(_meta(16, 8))
    with CudaAutocast(BF16):
        y = torch.nn.functional.linear(x, w)
        mm = x @ w.t()
        ln = torch.nn.functional.layer_norm(y, (16,))
        sm = torch.softmax(y, -1)
        sm_kept = torch.softmax(y, -1, dtype=BF16)
        s = y.sum()
        silu = torch.nn.functional.silu(y)
    assert (y.dtype, mm.dtype) == (BF16, BF16)  # lower_precision_fp
    assert ln.dtype == torch.float32  # fp32
    assert (sm.dtype, sm_kept.dtype, s.dtype) == (torch.float32, BF16, torch.float32)  # fp32_set_opt_dtype
    assert silu.dtype == BF16  # not listed: runs in its input's dtype


def test_promote_runs_in_the_widest_dtype():
    with CudaAutocast(BF16):
        out = torch.addcmul(_meta(4).to(BF16), _meta(4), _meta(4).to(BF16))
    assert out.dtype == torch.float32


def test_weight_cache_holds_trainable_weights_only_for_the_region():
    trainable = torch.nn.Parameter(_meta(16, 8))
    frozen = torch.nn.Parameter(_meta(16, 8), requires_grad=False)
    region = CudaAutocast(BF16)
    with region:
        a = region.cast(trainable, BF16)
        assert region.cast(trainable, BF16) is a  # cached: one half copy per forward
        assert region.cast(frozen, BF16) is not region.cast(frozen, BF16)  # frozen: cast at each use
        assert len(region._cache) == 1
    assert not region._cache  # cleared where autocast's outermost region ends


def test_amp_estimate_is_simulated_and_keeps_half_weight_copies_under_checkpointing():
    from trainmem.estimator.memory.states import meta_model

    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(precision="amp-bf16", batch_size=8, seq_len=256, checkpointing=True)
    b = estimate(spec, setup)
    assert b.method == "simulate" and b.peak_phase == "forward/backward"
    # checkpointing saves only layer inputs, but the region's cache keeps a bf16 copy of every trainable
    # matmul weight until the forward ends: the forward's tensors hold at least those copies
    model = meta_model(spec, setup, "amp-bf16")
    copies = 2 * sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    assert b.memory["activations"] >= copies
    # under LoRA the frozen base weights are cast at each use and not cached: no such floor
    lora = estimate(spec, setup.replace(peft="lora"))
    assert lora.memory["activations"] < b.memory["activations"] - copies // 2
