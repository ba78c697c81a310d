"""`run --gpu CARD` on a bigger CUDA card takes the card's workspaces and kernels: the parts testable here."""

from __future__ import annotations

from trainmem import ModelSpec, TrainSetup
from trainmem.hardware.cuda import workspace_bytes, workspace_config
from trainmem.hardware.gpus import find_gpu
from trainmem.isolation.engines import execute
from trainmem.measure.emulation import prepare


def test_workspace_config_is_pytorchs_default_for_the_card():
    for name in ("T4", "A10G", "RTX-4090", "A100-80GB", "H100-80GB", "H200"):
        card = find_gpu(name)
        assert workspace_bytes(workspace_config(card.sm)) == card.cublas_workspace
    assert workspace_config(find_gpu("T4").sm) == ":4096:2:16:8"  # 8 MiB + 128 KiB before Hopper
    assert workspace_config(find_gpu("H100-80GB").sm) == ":4096:8"  # 32 MiB on sm90


def test_prepare_sets_the_workspace_and_says_what_is_not_emulated(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    t4 = find_gpu("T4")
    cap = t4.allocator_cap("sdpa", "fp16", "none")
    record = prepare(t4, cap)
    assert record["cublas_workspace_config"] == ":4096:2:16:8" and record["allocator_cap"] == cap
    assert "no flash" in record["sdpa_kernels"] and "timings" in record["not_emulated"]


def test_cpu_runs_are_capped_by_the_ledger_not_emulated():
    r = execute(ModelSpec.resolve("tiny-llama"), TrainSetup(batch_size=2, seq_len=32, steps=2, num_samples=4,
                                                            device="cpu", gpu="T4"))
    assert r.status == "ok" and "emulated" not in r.env
