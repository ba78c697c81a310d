"""max-batch's searches against fake memory models with known answers, and the command without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainmem.maxbatch import Oracle, accumulation_for, largest, power_of_two, refine


def fake_card(answer: int) -> Oracle:
    """Memory of 3 GB + 0.7 GB a sample on a card where exactly `answer` samples fit."""
    capacity = 3.0 + 0.7 * answer + 0.35
    return Oracle(lambda b: 3.0 + 0.7 * b <= capacity)


@pytest.mark.parametrize("answer", [1, 2, 5, 37, 64, 1000])
def test_estimate_search_finds_the_answer_in_log_trials(answer):
    oracle = fake_card(answer)
    assert largest(oracle) == answer
    assert oracle.trials <= 2 * answer.bit_length() + 1
    assert all(ok == (b <= answer) for b, ok in oracle.tried)


def test_nothing_fits():
    oracle = fake_card(0)
    assert largest(oracle) == 0 and oracle.tried == [(1, False)]
    assert refine(fake_card(0), 3) == 0


def test_a_right_prediction_is_confirmed_with_two_runs():
    real = fake_card(37)
    assert refine(real, 37) == 37
    assert real.tried == [(37, True), (38, False)]
    assert power_of_two(fake_card(37)) == (32, 7)  # 1, 2, 4, 8, 16, 32 fit, 64 does not


def test_a_wrong_prediction_is_corrected_both_ways():
    low = fake_card(40)
    assert refine(low, 37) == 40
    assert low.tried == [(37, True), (38, True), (40, True), (44, False), (42, False), (41, False)]
    high = fake_card(30)
    assert refine(high, 37) == 30
    assert high.tried == [(37, False), (36, False), (34, False), (30, True), (32, False), (31, False)]


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


def test_command_needs_a_card():
    p = subprocess.run([sys.executable, "-m", "trainmem.cli", "max-batch", "--model", "tiny-gpt-neox",
                        "--target-batch", "0"], capture_output=True, text=True)
    assert p.returncode == 2 and "--gpu: max-batch needs the card" in p.stderr
    assert "--target-batch: expected a whole number >= 1" in p.stderr
