"""A setup that does not fit a card is told what it needs, not the card's size plus one request.

The capped allocator replay stops at the request the card cannot serve; the need is the smallest cap under which
the same replay runs: at most what the replay reserves without a cap (an allocator that is never full never
frees its cache), near it for setups far over the card, and allocated never exceeds reserved."""

from __future__ import annotations

import json

import pytest


import trainmem
from trainmem import TrainSetup
from trainmem.cli import main
from trainmem.hardware.gpus import CATALOG

OVER = [  # (model, setup fields, card): each needs 1.5x to 10x the card
    ("qwen2.5-0.5b", dict(precision="fp32", batch_size=8, seq_len=1024), "RTX-3060-12GB"),
    ("qwen2.5-0.5b", dict(precision="fp16", batch_size=4, seq_len=2048), "T4"),
    ("qwen2.5-0.5b", dict(precision="amp-bf16", batch_size=8, seq_len=2048), "RTX-3060-12GB"),
    ("gpt2", dict(precision="fp32", batch_size=32, seq_len=1024), "RTX-3060-12GB"),
    ("llama-3.2-1b", dict(precision="bf16", batch_size=8, seq_len=2048), "RTX-4080"),
    ("llama-3.2-1b", dict(precision="fp32", batch_size=4, seq_len=1024), "RTX-4080"),
    ("llama-3.2-1b", dict(precision="bf16", batch_size=8, seq_len=4096), "L4"),
    ("qwen3-0.6b", dict(precision="bf16", batch_size=16, seq_len=2048), "L4"),
    ("polyglot-ko-1.3b", dict(precision="fp16", batch_size=32, seq_len=256), "T4"),
    ("gemma-3-1b", dict(precision="bf16", batch_size=8, seq_len=2048), "L4"),
]


@pytest.mark.parametrize("model,fields,card", OVER, ids=[f"{m}-{c}-{f['precision']}" for m, f, c in OVER])
def test_a_setup_over_the_card_needs_at_most_what_its_uncapped_estimate_needs(model, fields, card, monkeypatch):
    setup = TrainSetup(gpu=card, **fields)
    capped = trainmem.estimate(model, setup, "simulate")
    verdict = capped.verdict(card)
    with monkeypatch.context() as m:
        m.setattr(TrainSetup, "cap_bytes", lambda self, precision=None: None)  # the same card, no cap
        uncapped = trainmem.estimate(model, setup, "simulate")
    need = uncapped.verdict(card)["need"]
    capacity = CATALOG[card].capacity
    assert verdict["level"] == "no" and 1.5 <= verdict["need"] / capacity <= 10
    assert 0.9 * need <= verdict["need"] <= need
    for b in (capped, uncapped):
        assert b.memory["peak_allocated"] <= b.memory["peak_reserved"] < b.memory["device_used"]
    assert any("the smallest cap under which the same allocator replay runs" in n for n in capped.notes)


def test_sweep_skips_a_setup_predicted_to_need_more_than_the_card(tmp_path, capsys):
    out = tmp_path / "sweep.jsonl"
    code = main(["sweep", "--model", "qwen2.5-0.5b", "--precision", "fp32", "--batch-size", "8", "--seq-len", "1024",
                 "--gpu", "RTX-3060-12GB", "--method", "measure", "--device", "cpu", "--estimator", "simulate",
                 "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == 0 and [r["status"] for r in rows] == ["skipped"]
    assert "skipped as a predicted OOM" in " ".join(rows[0]["notes"])
