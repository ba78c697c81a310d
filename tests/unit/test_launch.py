"""`trainmem run --launch`: 2 ranks as 2 processes under torchrun (`python -m torch.distributed.run`, which ships
with torch) over gloo on the CPU, FSDP2 and DDP. Each rank's states are checked against
`estimator/memory/sharding.rank_states` exactly, as test_fake_group.py and test_distributed.py check theirs, and
each FSDP2 rank's peak against the simulated estimate of the same setup, as test_sharded_estimate.py checks a
fake-group CPU run. NCCL on several GPUs runs the same rank code; it has not run here (no such machine)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from trainmem import ModelSpec, SetupError, TrainSetup
from trainmem.estimator import estimate
from trainmem.estimator.memory.sharding import rank_states
from trainmem.isolation import launch
from trainmem.isolation.engines import execute

SPEC = ModelSpec.resolve("tiny-llama")
# eager attention: the CPU ranks and the simulation take the same attention path (see test_sharded_estimate.py)
BASE = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu", precision="fp32", attention="eager")


def _params() -> list[torch.nn.Parameter]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return list(AutoModelForCausalLM.from_config(SPEC.hf_config()).parameters())


def _ranks(shard: str):
    r = launch.launch(SPEC, TrainSetup(gpus=2, shard=shard, **BASE))
    assert r.status == "ok", r.error
    assert [k["rank"] for k in r.ranks] == [0, 1] and r.env["peak_rank"] in (0, 1)
    assert r.env["backend"] == "gloo" and r.env["launcher"] == "torchrun" and r.env["world_size"] == 2
    assert r.memory == max((k["memory"] for k in r.ranks), key=lambda m: m["peak_allocated"])
    for k in r.ranks:
        m = k["memory"]
        assert m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["other"] == m["peak_allocated"]
    return r


def test_fsdp2_ranks_hold_the_formulas_states_and_peak_as_simulated():
    setup = TrainSetup(gpus=2, shard="fsdp", **BASE)
    r = _ranks("fsdp")
    params = _params()
    psi = sum(p.numel() for p in params)
    assert all(p.shape[0] % 2 == 0 for p in params)  # tiny-llama: FSDP2 pads nothing at world 2
    f = rank_states(4 * psi, 4 * psi, 8 * psi + 4 * len(params), psi, False, 2, "fsdp", "none", 0, False,
                    unsharded_optimizer=4 * len(params))
    b = estimate(SPEC, setup)  # auto: rank 0's FSDP2 step simulated under the fake group
    assert b.method == "simulate"
    for k in r.ranks:
        got = k["model_states"]
        assert got["gradients"] == f.gradients == 4 * psi // 2
        assert got["optimizer"] == f.optimizer == 8 * psi // 2 + 4 * len(params)  # AdamW's step: whole
        assert 0 <= got["weights"] - f.weights < 4096  # + the unsharded buffers (rotary inv_freq)
        # as test_sharded_estimate.py: the simulation adds the two cuBLAS workspaces a CUDA run has and the CPU
        # has not; less them, its peak is the CPU rank's within 64 bytes (scalars outside the model step, such as
        # the token count). Ranks of one shape hold the same bytes, so the estimate of rank 0 is each rank's.
        gap = b.terms["simulated_peak"] - b.terms["cublas_workspace"] - k["memory"]["peak_allocated"]
        assert abs(gap) <= 64, gap
    assert any("under torchrun, 2 CPU processes over gloo (fsdp" in n for n in r.notes)


def test_ddp_ranks_hold_the_whole_states_and_one_more_copy_of_the_gradients():
    r = _ranks("ddp")
    single = execute(SPEC, TrainSetup(**BASE))  # the same micro-batch in one process, no process group
    s = single.model_states
    f = rank_states(s["weights"], s["gradients"], s["optimizer"], sum(p.numel() for p in _params()), False, 2,
                    "ddp", "none", 0, False)
    for k in r.ranks:
        assert k["model_states"] == s  # weights, gradients, optimizer: whole on each rank
        assert (f.weights, f.optimizer) == (s["weights"], s["optimizer"])
        # the reducer's buckets, rank_states' DDP term, are what the rank holds beyond the one process
        assert k["memory"]["peak_allocated"] - single.memory["peak_allocated"] == f.gradients - s["gradients"] > 0
    # DDP has no simulated estimate (analytic only); the one-process run it is checked against is itself
    # checked against the simulation in test_estimate.py


def test_what_launch_cannot_run_is_one_line(monkeypatch):
    with pytest.raises(SetupError) as e:
        launch.launch(SPEC, TrainSetup(**BASE))
    assert e.value.problems == ["--launch: runs N ranks as N processes; needs --gpus N (N >= 2) and --shard "
                                "fsdp|ddp (got --gpus 1 --shard none)"]
    with pytest.raises(SetupError, match=r"--rank 1: --launch runs every rank; drop --rank"):
        launch.launch(SPEC, TrainSetup(gpus=2, shard="fsdp", rank=1, **BASE))
    from trainmem.measure import torchrun

    monkeypatch.setattr(torchrun.torch.cuda, "device_count", lambda: 1)
    assert torchrun.gpu_problems("cuda", 4) == [
        "--gpus 4: this machine shows 1 GPU and each rank needs its own; drop --launch to emulate one rank on one "
        "GPU, or use --device cpu for 4 processes over gloo"]
    assert torchrun.gpu_problems("cpu", 4) == []
    monkeypatch.setattr(launch.os, "access", lambda *a: False)
    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SetupError, match=r"--launch: torchrun is not installed for .* \(it ships with torch\)"):
        launch.launch(SPEC, TrainSetup(gpus=2, shard="ddp", **BASE))


def test_ranks_that_return_nothing_make_an_error_row(monkeypatch):
    monkeypatch.setattr(launch, "torchrun", lambda: [sys.executable, "-c", "import sys; sys.exit(3)"])
    r = launch.launch(SPEC, TrainSetup(gpus=2, shard="ddp", **BASE))
    assert r.status == "error" and r.error.startswith("2 of 2 ranks returned no result (torchrun exit 3)")


def test_cli_prints_the_command_and_a_rank_oom_is_a_row(capsys):
    from trainmem.cli import main

    argv = ["run", "--model", "tiny-llama", "--device", "cpu", "--gpus", "2", "--shard", "ddp", "--batch-size", "2",
            "--seq-len", "32", "--steps", "2", "--num-samples", "8", "--launch"]
    assert main(argv + ["--print-only"]) == 0
    line = capsys.readouterr().out.strip()
    assert "--standalone --nproc-per-node 2 -m trainmem.measure.torchrun " in line
    folder = Path(line.split()[-2]).parent
    job = json.loads((folder / "job.json").read_text())
    shutil.rmtree(folder)
    assert job["device"] == "cpu" and job["precision"] == "fp32" and job["setup"]["shard"] == "ddp"
    # 0.1 MiB: less than the model's weights, so each rank's build runs out of memory before any collective
    assert main(argv + ["--memory-cap", "0.1MiB", "--json"]) == 0  # an OOM is a result
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    row = json.loads(out)
    assert row["status"] == "oom" and row["oom"]["phase"] == "load"
    assert [k["status"] for k in row["ranks"]] == ["oom"] * 2
