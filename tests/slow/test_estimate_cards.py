"""Every card at once (`search.cards`) is `trainmem.estimate` on each card, from one simulation per runtime group
(resized to each card's cuBLAS workspace)."""

from __future__ import annotations

import dataclasses

import pytest


import trainmem
from trainmem.config.chapter import MODEL, RUNS
from trainmem.search.cards import estimate_cards, groups, largest_batches


def _made(b):
    """A Breakdown without the moment it was made (two estimates of one setup differ only there)."""
    return dataclasses.replace(b, env={k: v for k, v in b.env.items() if k != "utc"})

CHAPTER = {run.label: run.setup for run in RUNS}


@pytest.fixture(scope="module")
def chapter_spec():
    return trainmem.ModelSpec.resolve(MODEL)


def _estimate(spec, setup):
    return trainmem.estimate(spec, setup)


def _each_card(spec, setup):
    """`trainmem.estimate` with each catalog card, two at a time where the machine can fork (one simulation each)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    setups = [setup.replace(gpu=name) for name in trainmem.GPUS]
    try:
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
            found = list(pool.map(_estimate, [spec] * len(setups), setups))
    except (ValueError, OSError):
        found = [trainmem.estimate(spec, s) for s in setups]
    return dict(zip(trainmem.GPUS, found, strict=True))


@pytest.mark.parametrize("label", ["batch 16", "batch 8"])
def test_every_card_equals_estimate_with_that_card(chapter_spec, label):
    """The all-cards table of the chapter's full fine-tuning runs: each card's Breakdown, and so its level and
    headroom, equals `trainmem.estimate(spec, setup.replace(gpu=card))` (simulate, as `trainmem estimate --gpu
    CARD` gives it)."""
    setup = CHAPTER[label]
    answers = estimate_cards(chapter_spec, setup)
    assert list(answers) == list(trainmem.GPUS)
    wanted = _each_card(chapter_spec, setup)
    for name, got in answers.items():
        want = wanted[name]
        assert got.method == want.method == "simulate"
        v, w = got.verdict(name), want.verdict(name)
        assert (v["level"], v["headroom"]) == (w["level"], w["headroom"]), name
        assert _made(got) == _made(want), name  # memory, terms, notes, time: the whole Breakdown
    levels = {n: b.verdict(n)["level"] for n, b in answers.items()}
    assert levels["T4"] == ("no" if label == "batch 16" else "fits")  # the chapter's OOM, and its fitting run
    assert levels["A100-40GB"] == "fits"


def test_the_chapter_groups_are_the_runtimes_of_the_catalog(chapter_spec):
    got = [[c.name for c in g] for g in groups(chapter_spec, CHAPTER["batch 16"])]
    assert got[0] == ["T4", "V100-16GB", "V100-32GB"]  # no flash before sm80
    # every card with the flash kernel, whichever its cuBLAS workspace (Hopper's 32 MiB, Blackwell's 8 MiB +
    # 128 KiB as torch 2.11 has it, Ampere's and Ada's 8 MiB): the step is resized to each card's
    assert len(got) == 2 and {"A100-40GB", "RTX-4090", "H100-80GB", "H200", "B200", "RTX-PRO-6000"} <= set(got[1])


@pytest.mark.parametrize("fields", [dict(peft="qlora", checkpointing=True, precision="fp16"),
                                    dict(gpus=2, shard="fsdp", precision="bf16"),
                                    dict(optimizer="paged-adamw-8bit", precision="bf16", grad_accum=2),
                                    dict(kernels="liger", precision="bf16"),
                                    dict(attention="flash_attention_2", precision="bf16")])
def test_qlora_fsdp_and_paged_compose_as_estimate_does(fields):
    """QLoRA groups by the capped warm-up too; FSDP2 simulates no card (one group); paged states live outside
    the allocator; Liger's and flash-attn's kernels, which only the simulation prices, group by the SM count too
    (A10G and A100-40GB apart). Each composed Breakdown is still exactly `estimate`'s."""
    spec = trainmem.ModelSpec.resolve("tiny-llama")
    setup = trainmem.TrainSetup(batch_size=2, seq_len=32, **fields)
    cards = ["T4", "A10G", "A100-40GB", "H100-80GB"]
    answers = estimate_cards(spec, setup, cards)
    for name in cards:
        try:
            want = trainmem.estimate(spec, setup.replace(gpu=name))
        except trainmem.SetupError as e:  # bf16 on the T4
            assert answers[name].problems == e.problems
            continue
        assert _made(answers[name]) == _made(want), name
    by_sms = "kernels" in fields or "attention" in fields
    assert len(groups(spec, setup, cards)) == (1 if fields.get("shard") == "fsdp" else 4 if by_sms else 2)


def test_a_card_that_cannot_run_the_setup_is_its_problem_not_a_failure():
    spec = trainmem.ModelSpec.resolve("tiny-gpt-neox")
    answers = estimate_cards(spec, trainmem.TrainSetup(batch_size=2, seq_len=32, precision="bf16"),
                             ["T4", "A10G"], "analytic")
    assert isinstance(answers["T4"], trainmem.SetupError)
    assert "no native bf16" in answers["T4"].problems[0]
    assert answers["A10G"] == trainmem.estimate(spec, trainmem.TrainSetup(batch_size=2, seq_len=32, precision="bf16",
                                                                          gpu="A10G"), "analytic")
    with pytest.raises(trainmem.SetupError, match="unknown card 'T5'"):
        estimate_cards(spec, trainmem.TrainSetup(), ["T5"])


def test_largest_batches_is_max_batch_on_the_analytic_estimate(chapter_spec):
    setup = CHAPTER["batch 16"]
    found = largest_batches(chapter_spec, setup)
    assert set(found) == set(trainmem.GPUS)
    for card in ("T4", "RTX-3060-12GB", "A100-40GB"):  # without CUDA, max_batch searches the estimate only
        answer = trainmem.max_batch(chapter_spec, setup.replace(gpu=card), estimator="analytic")
        assert found[card] == answer["predicted"], card
    assert 8 <= found["T4"] < 16  # the chapter: batch 8 fits a T4, batch 16 does not
    assert largest_batches(chapter_spec, setup.replace(precision="bf16"), ["T4", "A10G"]).keys() == {"A10G"}
