"""The same experiments on a real GPU: allocator numbers, QLoRA, 8-bit optimizers, card caps."""

from __future__ import annotations

import pytest

from trainmem import ModelSpec, TrainSetup
from trainmem.isolation.engines import execute
from trainmem.measure.build import has_bitsandbytes

pytestmark = pytest.mark.gpu
SPEC = ModelSpec.resolve("tiny-llama")


def measure(**kw):
    base = dict(batch_size=4, seq_len=128, steps=3, num_samples=16, device="cuda")
    base.update(kw)
    return execute(SPEC, TrainSetup(**base))


def n_params():
    return SPEC.parameter_count


@pytest.mark.parametrize("precision,wbytes", [("fp32", 4), ("bf16", 2), ("fp16", 2), ("amp-bf16", 4), ("amp-fp16", 4)])
def test_precisions_on_cuda(precision, wbytes):
    r = measure(precision=precision)
    assert r.status == "ok", r.error
    assert r.model_states["gradients"] == wbytes * n_params()
    m = r.memory
    assert m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["other"] == m["peak_allocated"]
    assert m["peak_reserved"] >= m["peak_allocated"]
    assert m["device_used"] >= m["peak_reserved"]
    assert r.env["cuda_context"] > 0
    assert r.throughput["tokens_per_s"] > 0


def test_fused_and_sgd_on_cuda():
    assert measure(optimizer="adamw-fused").model_states["optimizer"] == 8 * n_params() + 4 * 21
    assert measure(optimizer="sgd").model_states["optimizer"] == 0


@pytest.mark.skipif(not has_bitsandbytes(), reason="needs bitsandbytes")
def test_qlora_on_cuda():
    r = measure(peft="qlora", precision="bf16", checkpointing=True)
    assert r.status == "ok", r.error
    assert 0 < r.model["trainable_parameters"] < n_params() // 4
    # Linear weights are packed 4-bit (uint8 storage, 2 values a byte); embeddings, norms and the head
    # stay unquantized and are upcast to fp32 by prepare_model_for_kbit_training
    assert r.model["loaded_parameters"] == n_params() + r.model["trainable_parameters"]
    assert r.model_states["weights"] < 4 * n_params()


@pytest.mark.skipif(not has_bitsandbytes(), reason="needs bitsandbytes")
@pytest.mark.parametrize("opt", ["adamw-8bit", "paged-adamw-8bit"])
def test_8bit_optimizers_on_cuda(opt):
    r = measure(optimizer=opt)
    assert r.status == "ok", r.error
    # 2 bytes per parameter of 8-bit state (+ absmax, and 32-bit state for tensors < 4096 elements)
    assert r.model_states["optimizer"] < 8 * n_params() / 2


def test_memory_cap_gives_oom_on_cuda():
    r = measure(memory_cap=8 * 2**20)
    assert r.status == "oom" and r.oom["phase"]


def test_gpu_flag_emulates_the_cards_workspace_and_kernels():
    # a T4's program on a bigger card: 8 MiB + 128 KiB cuBLAS workspaces, no flash kernel (run isolated,
    # so the workspace setting comes before the process's first cuBLAS handle)
    import trainmem

    r = trainmem.run(SPEC, TrainSetup(batch_size=4, seq_len=128, steps=3, num_samples=16, device="cuda",
                                      precision="fp16", gpu="T4"))
    assert r.status == "ok", r.error
    assert r.env["emulated"]["card"] == "T4" and r.env["emulated"]["cublas_workspace_config"] == ":4096:2:16:8"


def test_a_capped_run_does_not_cap_the_next_one_in_the_process():
    # the allocator fraction is per process: an uncapped run after a capped one must get the whole card
    # (the fake-group tests ran out of memory after the cap test in one pytest process before this was set)
    assert measure(memory_cap=8 * 2**20).status == "oom"
    r = measure()
    assert r.status == "ok", r.error
    assert r.memory["peak_reserved"] > 8 * 2**20


def test_safe_softmax_allocates_what_the_simulation_adds():
    # the math SDPA path's `_safe_softmax` is one operator to a dispatch mode; on CUDA it also allocates a
    # boolean test of its input and the per-row reduction of it, which simulate.CudaKernels adds
    import torch

    from trainmem.estimator.memory.allocator import round_size
    from trainmem.estimator.memory.simulate import CudaKernels

    x = torch.randn(2, 4, 256, 256, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = torch.ops.aten._safe_softmax.default(x, -1)
    extra = torch.cuda.max_memory_allocated() - before - round_size(out.untyped_storage().nbytes())
    meta = torch.empty(x.shape, device="meta")
    added = CudaKernels(None)(torch.ops.aten._safe_softmax.default, (meta,), meta)  # no ledger: not a matmul
    # the kernel's own 4-byte scalar is the only allocation the simulation leaves out (one 512-byte block)
    assert 0 <= extra - sum(round_size(n) for n in added) <= 512


def test_the_estimated_need_is_the_cap_the_run_needs():
    """The need an estimate reports for a setup over its cap (the smallest cap under which the simulated step's
    allocator replay runs) is where the real run starts to fit: 1% below it runs out, 1% above it trains."""
    from trainmem import estimate, run

    setup = TrainSetup(precision="bf16", batch_size=2, seq_len=512, steps=3)
    need = estimate("qwen2.5-0.5b", setup.replace(memory_cap=2**30)).memory["peak_reserved"]
    below = run("qwen2.5-0.5b", setup.replace(device="cuda", memory_cap=int(need * 0.99)))
    above = run("qwen2.5-0.5b", setup.replace(device="cuda", memory_cap=int(need * 1.01)))
    assert (below.status, above.status) == ("oom", "ok"), (need, below.error, above.error)
