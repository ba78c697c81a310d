"""`trainmem sweep`: grid expansion, a killed sweep resumed, and predicted OOMs skipped."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainmem.errors import SetupError
from trainmem.search.sweep import axes, expand, preset_points, resolve

CLI = [sys.executable, "-m", "trainmem.cli", "sweep"]


def test_comma_lists_expand_last_axis_fastest():
    found = axes({"batch_size": "4,8,16", "peft": "none, lora"})
    points = expand(found)
    assert found == {"batch_size": ["4", "8", "16"], "peft": ["none", "lora"]}
    assert len(points) == 6
    assert points[:3] == [{"batch_size": "4", "peft": "none"}, {"batch_size": "4", "peft": "lora"},
                          {"batch_size": "8", "peft": "none"}]


def test_yaml_grid_and_flags_combine_and_resolve(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("batch-size: [1, 2]\ncheckpointing: [false, true]\nprecision: fp32\n")
    points = expand(axes({"model": "tiny-llama", "seq_len": "16,32"}, str(grid)))
    assert len(points) == 8 and points[0] == {"model": "tiny-llama", "seq_len": "16", "batch_size": 1,
                                              "checkpointing": False, "precision": "fp32"}
    resolved = resolve(points)
    assert [(s.seq_len, s.batch_size, s.checkpointing) for _, s in resolved][:3] == [
        (16, 1, False), (16, 1, True), (16, 2, False)]
    assert {spec.name for spec, _ in resolved} == {"tiny-llama"}


def test_grid_conflicts_and_bad_values_are_reported_together(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("batch_size: [1]\nwidth: [3]\n")
    with pytest.raises(SetupError, match="unknown field 'width'"):
        axes({}, str(grid))
    grid.write_text("batch_size: [1]\n")
    with pytest.raises(SetupError, match="--batch-size: given both on the command line and in --grid"):
        axes({"batch_size": "2"}, str(grid))
    points = expand({"model": ["tiny-llama"], "batch_size": ["2", "x"], "peft": ["lora", "full"]})
    with pytest.raises(SetupError) as e:
        resolve(points)
    assert any("--batch-size: expected a whole number, got 'x'" in p for p in e.value.problems)
    assert sum("--peft: 'full' is not one of" in p for p in e.value.problems) == 2


def test_chapter_preset_is_the_seven_runs():
    points = preset_points("chapter")
    resolved = resolve(points)
    assert len(points) == 7 and {spec.name for spec, _ in resolved} == {"polyglot-ko-1.3b"}
    assert [(s.batch_size, s.grad_accum, s.peft, s.checkpointing) for _, s in resolved] == [
        (4, 1, "none", False), (8, 1, "none", False), (16, 1, "none", False), (4, 4, "none", False),
        (16, 1, "none", True), (16, 1, "lora", False), (16, 1, "qlora", True)]
    assert {s.precision for _, s in resolved} == {"fp16"}


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_killed_sweep_resumes_without_duplicates(tmp_path):
    out = tmp_path / "sweep.jsonl"
    cmd = CLI + ["--model", "tiny-gpt-neox", "--device", "cpu", "--method", "measure", "--batch-size", "1,2,3",
                 "--seq-len", "16", "--steps", "1", "--num-samples", "3", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    first = _rows(out)
    assert 1 <= len(first) < 3, "the sweep should have been killed part way"
    subprocess.run(cmd + ["--resume"], check=True, capture_output=True)
    rows = _rows(out)
    batches = [r["setup"]["batch_size"] for r in rows]
    assert sorted(batches) == [1, 2, 3] and rows[: len(first)] == first
    assert {(r["kind"], r["status"], r["setup"]["device"]) for r in rows} == {("measurement", "ok", "cpu")}


BIG = ["--model", "polyglot-ko-1.3b", "--precision", "fp16", "--batch-size", "64", "--gpu", "T4",
       "--method", "estimate", "--estimator", "analytic"]


def test_far_over_the_card_is_skipped_unless_forced(tmp_path):
    out = tmp_path / "sweep.jsonl"
    p = subprocess.run(CLI + BIG + ["--out", str(out)], capture_output=True, text=True, check=True)
    [row] = _rows(out)
    assert row["status"] == "skipped" and row["kind"] == "estimate" and row["verdict"]["fits"] is False
    assert "predicted OOM" in row["notes"][-1] and "--force" in row["notes"][-1]
    assert "1 skipped" in p.stderr
    subprocess.run(CLI + BIG + ["--out", str(out), "--resume", "--force"], capture_output=True, check=True)
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["skipped", "ok"] and rows[1]["verdict"]["fits"] is False


def test_the_sweep_from_python_writes_the_rows_the_command_writes(tmp_path):
    from trainmem import Sweep, load_setup

    out = tmp_path / "sweep.jsonl"
    point = load_setup("polyglot-ko-1.3b", {"precision": "fp16", "batch_size": 64, "gpu": "T4"})
    counts = Sweep([point], str(out), method="estimate", estimator="analytic").run()
    assert counts["skipped"] == 1 and counts["ok"] == 0
    subprocess.run(CLI + BIG + ["--out", str(tmp_path / "cli.jsonl")], capture_output=True, check=True)
    [row], [cli_row] = _rows(out), _rows(tmp_path / "cli.jsonl")
    assert row == cli_row
    with pytest.raises(SetupError, match="--method: 'guess' is not one of"):
        Sweep([point], str(out), method="guess")


def test_measure_without_cuda_estimates_and_says_so(tmp_path):
    out = tmp_path / "sweep.jsonl"
    p = subprocess.run(CLI + ["--model", "tiny-gpt-neox", "--seq-len", "16", "--method", "measure",
                              "--estimator", "analytic", "--out", str(out)], capture_output=True, text=True, check=True)
    assert "No CUDA device here: --method measure estimates instead" in p.stderr
    assert [r["kind"] for r in _rows(out)] == ["estimate"]


def test_bad_sweep_options_name_their_flag(tmp_path):
    p = subprocess.run(CLI + ["--method", "guess", "--estimator", "exact", "--out", str(tmp_path / "x.jsonl")],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "--method: 'guess' is not one of" in p.stderr and "--estimator: 'exact' is not one of" in p.stderr
