"""One answer: `max-batch` says what `estimate` says at the boundary, and the need a setup reports is continuous
in batch where the allocator replay is (the smallest cap under which the replay runs, not the uncapped replay)."""

from __future__ import annotations

import statistics

import pytest

from trainmem import ModelSpec, TrainSetup, estimate, max_batch
from trainmem.search.maxbatch import MISSES


def test_the_need_grows_by_one_step_a_batch_across_the_cards_capacity():
    """llama-3.2-1b LoRA at 1024 tokens on an A10G (22 GiB): batches 1-5 fit, 6-9 do not; the need the verdict
    reports grows by the same ~3.2 GiB a sample on both sides of the capacity (the uncapped replay's figure jumped
    +6.1 GiB then +0.5 GiB there)."""
    spec = ModelSpec.resolve("llama-3.2-1b")
    needs, levels = [], []
    for b in range(1, 10):
        v = estimate(spec, TrainSetup(batch_size=b, seq_len=1024, peft="lora", gpu="A10G")).verdict("A10G")
        needs.append(v["need"])
        levels.append(v["level"])
    assert levels == ["fits"] * 5 + ["no"] * 4
    steps = [b - a for a, b in zip(needs, needs[1:])]
    typical = statistics.median(steps)
    assert all(abs(s - typical) < 0.05 * typical for s in steps), [s / 2**30 for s in steps]


@pytest.mark.parametrize("kw", [dict(precision="fp16")])
def test_max_batch_is_the_largest_batch_estimate_says_fits(kw):
    """The chapter's model on the chapter's T4: estimate says `tight` at odd batches and `fits` at even ones near
    the capacity; max-batch answers the largest that fits (the chapter's measured T4 ran batch 8), names the
    ones below it that do not, and estimate agrees at the answer and at the `MISSES` batches above it."""
    spec = ModelSpec.resolve("polyglot-ko-1.3b")
    setup = TrainSetup(gpu="T4", **kw)
    answer = max_batch(spec, setup)
    b = answer["batch"]
    assert b >= 8 and answer["not_monotone"], answer
    level = lambda n: estimate(spec, setup.replace(batch_size=n)).verdict("T4")["level"]  # noqa: E731
    assert level(b) == "fits"
    assert all(level(n) != "fits" for n in answer["not_monotone"])
    assert all(level(n) != "fits" for n in range(b + 1, b + 1 + MISSES))
