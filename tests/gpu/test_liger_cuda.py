"""Liger's real Triton kernels on a GPU against the estimate's stand-ins (`--kernels liger`): skipped without
liger-kernel (carry its wheel, tests/gpu/README.md)."""

from __future__ import annotations

import importlib.util

import pytest

import trainmem
from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")]


@pytest.mark.parametrize("kernels", ["none", "liger"])
def test_liger_peaks_as_estimated(kernels):
    """llama-3.2-1b LoRA at 1024 tokens (a 128k vocabulary: the logits dominate without Liger): the run's peaks equal
    the estimate's within 1%. Each run has a process of its own, as `trainmem run` gives it, so that nothing the
    other GPU tests left in this process counts."""
    spec = ModelSpec.resolve("llama-3.2-1b")
    setup = TrainSetup(peft="lora", precision="bf16", batch_size=4, seq_len=1024, steps=3, num_samples=16,
                       device="cuda", kernels=kernels)
    r = trainmem.run(spec.name, setup)
    assert r.status == "ok", r.error
    e = estimate(spec, setup)
    for key in ("peak_allocated", "peak_reserved"):
        print(f"{kernels} {key}: measured {r.memory[key] / 2**30:.3f} GiB, estimated {e.memory[key] / 2**30:.3f} GiB")
        assert abs(e.memory[key] / r.memory[key] - 1) < 0.01
