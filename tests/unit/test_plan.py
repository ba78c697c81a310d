"""`trainmem plan`: the search on stub memory and time models with known answers, on the real estimator for a
tiny model, and the command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from trainmem import ModelSpec, TrainSetup
from trainmem.config.commands import run_command, training_arguments
from trainmem.estimator import Breakdown, estimate
from trainmem.hardware.gpus import CATALOG, GiB
from trainmem.search.plan import family, grid, job_tokens, search

SPEC = ModelSpec.resolve("tiny-llama")
BASE = TrainSetup(seq_len=32, precision="fp16").validate(SPEC)
T4 = CATALOG["T4"]


def fake_estimate(reserved_of):
    """An estimator whose reserved bytes are `reserved_of(setup, method)`."""
    def fn(setup: TrainSetup, method: str) -> Breakdown:
        reserved = int(reserved_of(setup, method))
        memory = {"weights": reserved, "gradients": 0, "optimizer": 0, "activations": 0, "other": 0,
                  "peak_allocated": reserved, "peak_reserved": reserved, "device_used": 0}
        return Breakdown(method, memory, {}, "forward/backward", {**setup.to_dict(), "device": "cuda"}, {}, 0)
    return fn


def activations_model(setup: TrainSetup, method: str = "analytic") -> float:
    """4 GiB of states (1 under LoRA) + 1 GiB a sample (a quarter under checkpointing)."""
    states = 1 if setup.peft != "none" else 4
    return (states + setup.batch_size * (0.25 if setup.checkpointing else 1.0)) * GiB


def stub_time(setup: TrainSetup, b: Breakdown) -> dict[str, float]:
    """Fewer micro-steps are faster, checkpointing costs a third more, LoRA saves a quarter, QLoRA a tenth."""
    step = setup.grad_accum * 1.0 + 0.1 * setup.batch_size
    step *= (4 / 3 if setup.checkpointing else 1) * {"none": 1, "lora": 0.75, "qlora": 0.9}[setup.peft]
    return {"step_s": step, "tokens_per_s": setup.batch_size * setup.grad_accum * setup.seq_len / step, "mfu": 0.3}


@pytest.mark.parametrize("target", [1, 6, 16, 24, 37])
def test_grid_reaches_the_target_batch_exactly(target):
    setups = grid(BASE, target, ["checkpointing", "peft", "optimizer", "precision"], T4)
    assert setups and all(s.batch_size * s.grad_accum == target and target % s.batch_size == 0 for s in setups)
    assert {s.batch_size for s in setups} == {d for d in range(1, target + 1) if target % d == 0}
    assert not any("bf16" in s.precision for s in setups)  # the T4 runs no bf16
    assert {s.optimizer for s in setups} == {"adamw", "adamw-fused", "adamw-8bit"}


def test_what_is_not_allowed_stays_as_given():
    setups = grid(BASE.replace(peft="lora"), 8, [], T4)
    assert {family(s) for s in setups} == {("lora", False, "fp16")} and {s.optimizer for s in setups} == {"adamw"}


def test_search_ranks_by_the_time_model_and_lists_only_what_fits():
    plan = search(SPEC, BASE, T4, 16, ["checkpointing", "peft"], estimate_fn=fake_estimate(activations_model),
                  time_fn=stub_time, every=True, finalists=2)
    assert plan.options, "something fits"
    for o in plan.options:
        assert activations_model(o.setup) + T4.overhead("sdpa", "fp16", o.setup.peft) <= T4.capacity
        assert o.level in ("fits", "tight") and o.setup.batch_size * o.setup.grad_accum == 16
    times = [o.step_s for o in plan.options]
    assert times == sorted(times)
    fitting = [s for s in grid(BASE, 16, ["checkpointing", "peft"], T4)
               if activations_model(s) + T4.overhead("sdpa", "fp16", s.peft) <= T4.capacity]
    assert len(plan.options) == len(fitting) and plan.not_fitting == plan.searched - len(fitting)
    best = min(fitting, key=lambda s: stub_time(s, None)["step_s"])
    assert plan.options[0].setup == best.replace(gpu="T4")
    assert [o.checked for o in plan.options[:3]] == ["simulate", "simulate", "analytic"]


def test_a_finalist_that_simulate_rejects_is_dropped_and_the_next_moves_up():
    def reserved(setup: TrainSetup, method: str) -> float:
        over = method == "simulate" and setup.peft == "lora" and setup.batch_size == 8 and not setup.checkpointing
        return 20 * GiB if over else activations_model(setup)

    plan = search(SPEC, BASE, T4, 8, ["checkpointing", "peft"], estimate_fn=fake_estimate(reserved),
                  time_fn=stub_time)
    assert [(d["setup"]["batch_size"], d["setup"]["peft"], d["simulate"]) for d in plan.dropped] == [(8, "lora", "no")]
    listed = [(o.setup.peft, o.setup.checkpointing, o.setup.batch_size) for o in plan.options]
    assert ("lora", False, 8) not in listed and ("lora", False, 4) in listed  # its family's next micro-batch
    assert plan.options[0].checked == "simulate" and listed[0] == ("qlora", False, 8)
    # one row per way to train: the fastest micro-batch of each
    assert len({family(o.setup) for o in plan.options}) == len(plan.options)


def test_real_estimator_every_listed_setup_fits():
    plan = search(SPEC, BASE, CATALOG["H100-80GB"], 8, ["checkpointing", "peft"], finalists=1)
    assert plan.options and plan.options[0].checked == "simulate"
    for o in plan.options:
        assert estimate(SPEC, o.setup, "analytic").verdict("H100-80GB")["level"] != "no"
    assert [o.step_s for o in plan.options] == sorted(o.step_s for o in plan.options)
    assert all(o.setup.batch_size * o.setup.grad_accum == 8 for o in plan.options)


def test_job_time_commands_and_training_arguments():
    assert job_tokens(None, 2, 1000, 256) == 512_000 and job_tokens(10**6, None, None, 256) == 10**6
    plan = search(SPEC, BASE, T4, 4, [], finalists=0, job=4 * 32 * 10)
    o = plan.options[0]
    assert plan.job_s(o) == pytest.approx(10 * o.step_s)
    s = BASE.replace(batch_size=2, grad_accum=2, checkpointing=True, peft="lora", gpu="T4")
    assert run_command("tiny-llama", s) == ("trainmem run --model tiny-llama --batch-size 2 --grad-accum 2 --seq-len 32 "
                                           "--precision fp16 --optimizer adamw --peft lora --checkpointing --gpu T4")
    args = training_arguments(s)
    assert "per_device_train_batch_size=2" in args and "gradient_accumulation_steps=2" in args
    assert "gradient_checkpointing=True" in args and 'optim="adamw_torch"' in args and "LoraConfig(r=8" in args


CLI = [sys.executable, "-m", "trainmem.cli", "plan"]


def test_plan_json_reaches_the_target_and_ranks():
    p = subprocess.run(CLI + ["--model", "tiny-llama", "--gpu", "T4", "--target-batch", "8", "--seq-len", "32",
                              "--precision", "fp16", "--tokens", "100000", "--json", "--finalists", "1"],
                       capture_output=True, text=True, check=True)
    out = json.loads(p.stdout)
    assert out["gpu"] == "T4" and out["target_batch"] == 8 and out["options"]
    steps = [o["step_s"] for o in out["options"]]
    assert steps == sorted(steps) and all(o["job_s"] > 0 for o in out["options"])
    assert all(o["setup"]["batch_size"] * o["setup"]["grad_accum"] == 8 for o in out["options"])
    assert out["options"][0]["command"].startswith("trainmem run --model tiny-llama")


def test_make_plan_from_python_is_the_command():
    from trainmem import load_setup, make_plan

    flags = ["--model", "tiny-llama", "--gpu", "T4", "--target-batch", "8", "--seq-len", "32", "--precision", "fp16",
             "--allow", "peft,checkpointing", "--epochs", "2", "--dataset-size", "100", "--top", "3", "--json"]
    p = subprocess.run(CLI + flags, capture_output=True, text=True, check=True)
    spec, setup = load_setup("tiny-llama", {"seq_len": "32", "precision": "fp16", "gpu": "T4"})
    plan = make_plan(spec, setup, 8, allow=("peft", "checkpointing"), epochs=2, dataset_size=100, top=3)
    assert plan.to_dict() == json.loads(p.stdout) and len(plan.options) == 3 and plan.job_tokens == 200 * 32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_confirm_without_cuda_says_so():
    p = subprocess.run(CLI + ["--model", "tiny-llama", "--gpu", "T4", "--target-batch", "8", "--confirm"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--confirm" in p.stderr and "CUDA" in p.stderr


def test_bad_flags_are_reported_at_once():
    p = subprocess.run(CLI + ["--model", "tiny-llama", "--batch-size", "4", "--allow", "peft,colour",
                              "--epochs", "2"], capture_output=True, text=True)
    assert p.returncode == 2
    for flag in ("--batch-size", "--allow", "--epochs", "--target-batch", "--gpu"):
        assert flag in p.stderr


def test_chapter_preset_on_the_t4():
    p = subprocess.run(CLI + ["--preset", "chapter", "--gpu", "T4", "--finalists", "0", "--json"],
                       capture_output=True, text=True, check=True)
    out = json.loads(p.stdout)
    assert out["model"] == "polyglot-ko-1.3b" and out["target_batch"] == 16 and out["seq_len"] == 256
    kinds = {(o["setup"]["peft"], o["setup"]["checkpointing"]) for o in out["options"]}
    assert ("lora", False) in kinds and all(o["setup"]["precision"] == "fp16" for o in out["options"])
    assert all(o["level"] in ("fits", "tight") for o in out["options"])
