"""Accumulated gradients equal the full batch's in float64; the seed's naive rule does not on uneven data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from trainmem import ModelSpec, SetupError, TrainSetup, verify_accumulation
from trainmem.cli import main as cli_main
from trainmem.measure.verify import group_of

EXACT = 1e-10
# The naive rule is off by 0.22-0.26 on these models' partial windows (8 = 3 + 3 + 2, seq 32-256:
# docs/lab/data/accumulation-partial-window-cpu-2026-12-03.jsonl) and by 0.009-0.15 on whole micro-batches of
# uneven lengths (docs/lab/accumulation.md, benchmarks/accumulation_plot.py); 1e-3 is below both and far from
# rounding (~1e-15).
OFF = 1e-3


def verify(model="tiny-llama", full=8, micro=3, **setup):
    return verify_accumulation(ModelSpec.resolve(model), TrainSetup(**{"seq_len": 32, **setup}), full, micro)


@pytest.mark.parametrize("model", ["tiny-gpt-neox", "tiny-llama"])
def test_partial_window_matches_full_batch_and_naive_does_not(model):
    r = verify(model, full=8, micro=3)
    assert r.micro_batches == 3 and r.label_tokens == [3 * 31, 3 * 31, 2 * 31]  # last micro-batch partial
    assert r.dtype == "float64" and r.passed
    assert r.max_rel_error <= EXACT
    assert all(g.rel_error <= EXACT for g in r.groups)
    # Equal-length data, but 2 samples in the last micro-batch get the weight of 3 under the naive rule.
    assert r.naive_max_rel_error > OFF
    assert abs(r.loss_accumulated - r.loss_full) <= 1e-6 * r.loss_full


def test_padded_uneven_text_matches_full_batch(model_dir, text_file):
    r = verify_accumulation(ModelSpec.resolve(str(model_dir)), TrainSetup(data=str(text_file), seq_len=16),
                            full_batch=8, micro_batch=4)
    # Two micro-batches of 4 samples each: only the padding makes their token counts differ.
    assert r.micro_batches == 2 and r.label_tokens[0] != r.label_tokens[1]
    assert r.max_rel_error <= EXACT
    assert r.naive_max_rel_error > OFF


def test_naive_equals_full_batch_on_equal_lengths_and_whole_micro_batches():
    r = verify("tiny-gpt-neox", full=8, micro=4)
    assert r.label_tokens == [4 * 31, 4 * 31]
    assert r.max_rel_error <= EXACT
    assert r.naive_max_rel_error <= EXACT


def test_lora_adapters_match_full_batch():
    r = verify(peft="lora")
    # peft's default targets for Llama are q_proj and v_proj: A and B of each, in 2 layers.
    assert {g.group for g in r.groups} == {"layer 0 self_attn", "layer 1 self_attn"}
    assert sum(g.tensors for g in r.groups) == 8
    assert r.max_rel_error <= EXACT
    assert r.naive_max_rel_error > OFF


def test_dropout_on_breaks_equality_and_the_report_says_why():
    # LoRA dropout (0.05 by default) is the only dropout of the tiny preset; off, the test above passes.
    r = verify_accumulation(ModelSpec.resolve("tiny-llama"), TrainSetup(seq_len=32, peft="lora"), 8, 3,
                            dropout=True)
    assert r.dropout and r.max_rel_error > OFF and not r.passed
    assert "masks" in r.to_dict()["dropout_note"]


def test_float32_stays_within_its_documented_bound():
    r = verify_accumulation(ModelSpec.resolve("tiny-llama"), TrainSetup(seq_len=32), 8, 3, dtype=torch.float32)
    assert r.dtype == "float32" and r.tolerance == 1e-5
    assert r.max_rel_error <= r.tolerance < r.naive_max_rel_error


def test_bad_batch_sizes_name_their_flag():
    with pytest.raises(SetupError, match="--micro-batch: 9 is larger than --full-batch 4"):
        verify(full=4, micro=9)
    with pytest.raises(SetupError, match="--full-batch: must be a whole number >= 1, got 0"):
        verify(full=0, micro=1)
    with pytest.raises(SetupError, match="--full-batch: 80 is more than the 64 samples"):
        verify(full=80, micro=8)


def test_groups_read_as_layer_and_module():
    assert group_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") == "layer 0 self_attn"
    assert group_of("gpt_neox.layers.1.mlp.dense_h_to_4h.bias") == "layer 1 mlp"
    assert group_of("model.embed_tokens.weight") == "embed_tokens"
    assert group_of("lm_head.weight") == "lm_head"


def test_cli_json_in_a_fresh_process():
    proc = subprocess.run([sys.executable, "-m", "trainmem.cli", "verify-accumulation", "--model", "tiny-llama",
                           "--seq-len", "16", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["max_rel_error"] <= EXACT < OFF < report["naive_max_rel_error"]
    assert report["micro_batches"] == 3 and report["label_tokens"] == [45, 45, 30]
    assert {"groups", "loss_full", "loss_naive", "dropout_note", "passed", "window_tokens"} <= set(report)


def test_cli_table_and_bad_flag(capsys):
    assert cli_main(["verify-accumulation", "--model", "tiny-gpt-neox", "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "worst parameter" in out and "layer 1 attention" in out
    assert cli_main(["verify-accumulation", "--full-batch", "2", "--micro-batch", "5"]) == 2
    assert "--micro-batch: 5 is larger than --full-batch 2" in capsys.readouterr().err
