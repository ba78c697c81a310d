"""max-batch's searches against fake memory models with known answers, and the command without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainmem.search.maxbatch import (
    Measured,
    Oracle,
    accumulation_for,
    largest,
    newton,
    power_of_two,
    scan,
    settle,
)

GB = 10**9


def fake_card(answer: int) -> Oracle:
    """Memory of 3 GB + 0.7 GB a sample on a card where exactly `answer` samples fit."""
    capacity = 3.0 + 0.7 * answer + 0.35
    return Oracle(lambda b: 3.0 + 0.7 * b <= capacity)


def fake_runs(answer: int, per_sample: float = 0.7, oom_above: int | None = None) -> Measured:
    """Real runs on a card where exactly `answer` samples fit: 3 GB + `per_sample` GB a sample, measured
    to the byte; batches above `oom_above` run out of memory even under the relaxed cap (no bytes)."""
    budget = int((3.0 + per_sample * answer + per_sample / 2) * GB)
    return Measured(lambda b: None if oom_above and b > oom_above else int((3.0 + per_sample * b) * GB), budget)


ESTIMATED_SLOPE = lambda b: 0.7 * GB  # noqa: E731  the estimate's bytes per sample


@pytest.mark.parametrize("answer", [1, 2, 5, 37, 64, 1000])
def test_estimate_search_finds_the_answer_in_log_trials(answer):
    oracle = fake_card(answer)
    assert largest(oracle) == answer
    assert oracle.trials <= 2 * answer.bit_length() + 1
    assert all(ok == (b <= answer) for b, ok in oracle.tried)


def test_nothing_fits():
    oracle = fake_card(0)
    assert largest(oracle) == 0 and oracle.tried == [(1, False)]
    runs = fake_runs(0)
    assert newton(runs, 3, ESTIMATED_SLOPE) == 0 and runs.tried == [(3, False), (1, False)]


def test_a_right_prediction_is_confirmed_with_two_runs():
    real = fake_runs(37)
    assert newton(real, 37, ESTIMATED_SLOPE) == 37
    assert real.tried == [(37, True), (38, False)]
    assert power_of_two(fake_card(37)) == (32, 7)  # 1, 2, 4, 8, 16, 32 fit, 64 does not


@pytest.mark.parametrize("answer", [30, 36, 40, 90])
def test_a_wrong_prediction_is_corrected_in_one_step(answer):
    runs = fake_runs(answer)
    assert newton(runs, 37, ESTIMATED_SLOPE) == answer
    closing = [] if answer + 1 == 37 else [(answer + 1, False)]  # 37 itself already showed it does not fit
    assert runs.tried == [(37, answer >= 37), (answer, True), *closing]


def test_a_wrong_slope_is_replaced_by_the_measured_one():
    """The estimate says 0.7 GB a sample, the card needs 1.0: the second step uses the two runs' own slope."""
    runs = fake_runs(60, per_sample=1.0)
    assert newton(runs, 30, ESTIMATED_SLOPE) == 60
    assert runs.trials <= 4 and runs.tried[-1] == (61, False)
    assert all(ok == (b <= 60) for b, ok in runs.tried)


def test_runs_out_of_memory_under_the_relaxed_cap_halve_until_one_measures():
    runs = fake_runs(4, oom_above=6)
    assert newton(runs, 10, ESTIMATED_SLOPE) == 4
    assert runs.tried == [(10, False), (5, False), (4, True)]


@pytest.mark.parametrize("answer", [0, 1, 7, 64, 300])
@pytest.mark.parametrize("start", [0, 1, 6, 7, 8, 64, 70, 290])
def test_settling_from_a_close_guess_finds_the_answer_and_costs_two_trials_when_right(answer, start):
    oracle = Oracle(lambda b: b <= answer)
    assert settle(oracle, start) == answer
    if start == answer >= 1:
        assert oracle.trials == 2  # the guess and the batch above it
    assert oracle.trials <= 2 + 2 * max(abs(start - answer), 1).bit_length()


def test_target_batch_uses_the_largest_divisor():
    assert accumulation_for(24, 5) == (4, 6)
    assert accumulation_for(24, 8) == (8, 3)
    assert accumulation_for(16, 64) == (16, 1)
    assert accumulation_for(7, 4) == (1, 7)


def test_command_answers_from_the_estimate_without_a_gpu():
    cmd = [sys.executable, "-m", "trainmem.cli", "max-batch", "--model", "tiny-gpt-neox", "--seq-len", "64",
           "--gpu", "T4", "--target-batch", "24"]
    answer = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True).stdout)
    assert answer["confirmed"] is False and answer["trials"] == 0 and answer["batch"] == answer["predicted"] >= 24
    assert (answer["micro_batch"], answer["grad_accum"]) == (24, 1)
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "no CUDA device here" in text and "power-of-two search" in text
    from trainmem import load_setup, max_batch

    spec, setup = load_setup("tiny-gpt-neox", {"seq_len": 64, "gpu": "T4"})
    assert max_batch(spec, setup, target=24) == answer  # the library answers as the command does


def test_command_needs_a_card():
    p = subprocess.run([sys.executable, "-m", "trainmem.cli", "max-batch", "--model", "tiny-gpt-neox",
                        "--target-batch", "0"], capture_output=True, text=True)
    assert p.returncode == 2 and "--gpu: max-batch needs the card" in p.stderr
    assert "--target-batch: expected a whole number >= 1" in p.stderr


def test_allocator_steps_do_not_turn_the_search_into_a_walk():
    """Real peaks rise in steps (a new large segment every few samples) and the estimate's slope is only
    close: the search still bisects when a step overshoots instead of walking one batch at a time."""
    def staircase(b: int) -> int:
        return int((60 + 0.1 * b + 4.0 * (b // 6)) * GB)
    budget = staircase(132) + GB // 10
    runs = Measured(staircase, budget)
    assert newton(runs, 122, lambda b: 0.6 * GB) == max(b for b in range(1, 400) if staircase(b) <= budget)
    assert runs.trials <= 7


def test_real_runs_are_judged_by_the_estimates_rule(monkeypatch):
    """A confirming run measures what the card would need as the estimate counts it: peak reserved plus the
    setup's memory outside the allocator (context, and the fused-attention kernels under half-precision SDPA),
    and runs under `RELAX` times the card's allocator cap for the setup. The run is stubbed (no GPU here)."""
    import torch

    import trainmem.isolation.runner
    from trainmem import ModelSpec, TrainSetup
    from trainmem.hardware.gpus import find_gpu
    from trainmem.search.maxbatch import RELAX, _real_runs

    spec, card = ModelSpec.resolve("tiny-llama"), find_gpu("T4")
    setup = TrainSetup(gpu="T4", precision="fp16", attention="sdpa", seq_len=32)
    caps = []

    class Row:
        status, error = "ok", None
        memory = {"peak_reserved": 10 * GB}

    def run(spec, setup):
        caps.append(setup.memory_cap)
        return Row()

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 141 * GB}))
    monkeypatch.setattr(trainmem.isolation.runner, "run", run)
    runs, notes = _real_runs(spec, setup, card, 0.02)
    assert runs.measure(4) == 10 * GB + card.overhead("sdpa", "fp16", "none") == 10 * GB + card.context + 16 * 2**20
    assert caps == [int(RELAX * card.allocator_cap("sdpa", "fp16", "none"))] and not notes


def test_scan_goes_past_batches_that_miss_where_memory_is_not_monotone():
    """polyglot-ko-1.3b in fp16 on a T4: the estimate says `tight` at 5, 7 and 9 and `fits` at 6 and 8; a
    monotone search stops at 4, the scan finds 8 and names the batches below it that do not fit."""
    levels = {5: "tight", 6: "fits", 7: "tight", 8: "fits", 9: "tight", 10: "tight", 11: "tight", 12: "fits"}
    seen = []

    def level(b):
        seen.append(b)
        return levels.get(b, "no")

    assert scan(level, 4) == (8, [5, 7])
    assert seen == [5, 6, 7, 8, 9, 10, 11]  # three misses in a row end it: 12 is never asked
    assert scan(lambda b: "fits" if b <= 4 else "no", 4) == (4, [])  # beyond the card: no further batch is tried
    assert scan(lambda b: "fits", 10, limit=12) == (12, [])
