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


def test_an_empty_item_of_a_comma_list_is_named_not_dropped():
    with pytest.raises(SetupError) as e:
        axes({"batch_size": "2,,4", "seq_len": "16,32,", "peft": "lora"})
    assert e.value.problems == [
        "--batch-size: '2,,4' has an empty item (item 2 of 3); put one value between commas, e.g. 2,4",
        "--seq-len: '16,32,' has an empty item (item 3 of 3); put one value between commas, e.g. 16,32"]
    problems: list[str] = []  # given a list, the axis is left out and the rest is checked
    assert axes({"batch_size": "2,,4", "peft": " none , lora"}, problems=problems) == {"peft": ["none", "lora"]}
    assert len(problems) == 1 and problems[0].startswith("--batch-size: '2,,4' has an empty item")
    assert axes({"batch_size": ""}) == {"batch_size": [""]}  # no comma: one value, which validation refuses


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


def test_lora_values_of_a_grid_are_for_its_lora_points():
    """`--peft none,lora --lora-r 8,16`: the LoRA points take each rank, the full fine-tuning point is made once
    with none; LoRA values where no point has LoRA are refused, naming the flag."""
    points = expand({"model": ["tiny-llama"], "peft": ["none", "lora"], "lora_r": ["8", "16"], "lora_dropout": ["0"]})
    resolved = [s for _, s in resolve(points)]
    assert [(s.peft, s.lora_r, s.lora_dropout) for s in resolved] == [("none", 8, 0.05), ("lora", 8, 0.0),
                                                                      ("lora", 16, 0.0)]
    with pytest.raises(SetupError) as e:
        resolve(expand({"model": ["tiny-llama"], "peft": ["none"], "lora_r": ["8", "16"]}))
    assert e.value.problems == ["--lora-r: applies to --peft lora or qlora, and no point of the sweep has one; add "
                                "lora to --peft or drop --lora-r"]
    with pytest.raises(SetupError) as e:  # no --peft axis: each point is a setup like any other
        resolve(expand({"model": ["tiny-llama"], "lora_alpha": ["16"]}))
    assert e.value.problems == ["point 1 (model=tiny-llama, lora_alpha=16): --lora-alpha: applies to --peft lora or "
                                "qlora, and --peft is none; add --peft lora or drop --lora-alpha"]
    chapter = resolve(expand({"lora_r": ["16"]}, preset_points("chapter")))
    assert [(s.peft, s.lora_r) for _, s in chapter][-3:] == [("none", 8), ("lora", 16), ("qlora", 16)]


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
    row["env"].pop("utc"), cli_row["env"].pop("utc")  # made a moment apart
    assert row == cli_row
    with pytest.raises(SetupError, match="--method: 'guess' is not one of"):
        Sweep([point], str(out), method="guess")


def test_a_sweep_into_rows_already_there_needs_resume(tmp_path):
    """Without --resume a sweep would append every point again after the rows an earlier one wrote: refused,
    naming the file and both ways on. An empty file is no earlier sweep."""
    from trainmem import Sweep

    out = tmp_path / "sweep.jsonl"
    out.write_text("")
    assert Sweep(_tiny(1), str(out), method="estimate", estimator="analytic").run()["ok"] == 1
    with pytest.raises(SetupError) as e:
        Sweep(_tiny(1, 2), str(out), method="estimate", estimator="analytic")
    assert e.value.problems == [f"--out: {out} already holds 1 line; a sweep without --resume would append its points "
                                "again: add --resume to skip the points it holds, or pass a new --out"]
    counts = Sweep(_tiny(1, 2), str(out), method="estimate", estimator="analytic", resume=True).run()
    assert (counts["resumed"], counts["ok"]) == (1, 1) and len(_rows(out)) == 2


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


# --- nothing lost: a cut line, one writer per --out, error rows retried, interrupted sweeps --------------------
EST = ["--model", "tiny-gpt-neox", "--seq-len", "16", "--method", "estimate"]


def _stderr(p) -> str:
    """The command's stderr, one space between words; it never holds a traceback."""
    assert "Traceback" not in p.stderr, p.stderr
    return " ".join(p.stderr.split())


def _tiny(*batches, **fields):
    from trainmem import load_setup

    return [load_setup("tiny-gpt-neox", {"seq_len": "16", "batch_size": str(b), **fields}) for b in batches]


def test_a_cut_last_line_is_moved_aside_before_resume_adds_rows(tmp_path):
    from trainmem import Sweep, read_rows

    out = tmp_path / "sweep.jsonl"
    Sweep(_tiny(1, 2, 3), str(out), method="estimate", estimator="analytic").run()
    whole = out.read_text().splitlines(keepends=True)
    cut = whole[2][:70]  # the third row, as a sweep killed while writing it left it
    out.write_text(whole[0] + whole[1] + cut)
    p = subprocess.run(CLI + EST + ["--estimator", "analytic", "--batch-size", "1,2,3,4", "--out", str(out), "--resume"],
                       capture_output=True, text=True)
    err = _stderr(p)
    assert p.returncode == 0, err
    [aside] = tmp_path.glob("sweep.jsonl.partial-*")
    assert aside.read_text() == cut
    assert f"warning: {out} ended in a cut line: moved its {len(cut)} bytes to {aside}" in err
    problems: list = []
    rows = read_rows(out, problems)
    assert problems == [] and len(rows) == len(out.read_text().splitlines()) == 4
    assert out.read_text().startswith(whole[0] + whole[1])
    assert [r["setup"]["batch_size"] for r in rows] == [1, 2, 3, 4]
    assert "4 points: 2 run, 2 resumed, 0 errors -> " in err


def test_a_second_sweep_on_the_same_out_stops_at_once(tmp_path):
    out = tmp_path / "sweep.jsonl"
    cmd = CLI + EST + ["--estimator", "simulate", "--batch-size", ",".join(map(str, range(1, 11))), "--out", str(out)]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.05)
    assert first.poll() is None, "the first sweep should still be running"
    started = time.time()
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    took = time.time() - started
    _, first_err = first.communicate(timeout=120)
    err = _stderr(second)
    assert second.returncode == 2 and took < 5, (second.returncode, took, err)
    assert (f"--out: {out} is being written by another trainmem (pid {first.pid}, lock {out}.lock); "
            "wait for it to finish, or pass another --out") in err
    assert first.returncode == 0 and "Traceback" not in first_err
    rows = _rows(out)
    assert sorted(r["setup"]["batch_size"] for r in rows) == list(range(1, 11))  # each point once
    assert not (tmp_path / "sweep.jsonl.lock").exists()


def test_resume_reruns_error_rows_only_with_retry_errors(tmp_path, monkeypatch):
    from trainmem import Sweep
    from trainmem.isolation import runner
    from trainmem.search.sweep import done_keys, point_key, resolved_setup

    out = tmp_path / "sweep.jsonl"
    [(spec, setup)] = _tiny(1, device="cpu", steps="1", num_samples="2")
    # a worker killed from outside (say the OOM killer): the runner's own error row, its setup as given
    monkeypatch.setattr(runner, "run", lambda spec, setup: runner._failed(spec, setup, "the worker process died (exit -9)"))
    assert Sweep([(spec, setup)], str(out), method="measure").run()["error"] == 1
    monkeypatch.undo()
    key = point_key("measurement", spec.name, resolved_setup(spec, setup, "measurement"))
    assert done_keys(str(out)) == {key} and done_keys(str(out), redo_errors=True) == set()
    cmd = CLI + ["--model", "tiny-gpt-neox", "--seq-len", "16", "--batch-size", "1", "--device", "cpu", "--steps", "1",
                 "--num-samples", "2", "--method", "measure", "--out", str(out), "--resume"]
    p = subprocess.run(cmd + ["--retry-errors"], capture_output=True, text=True)
    err = _stderr(p)
    assert p.returncode == 0, err
    assert [r["status"] for r in _rows(out)] == ["error", "ok"] and "1 points: 1 run, 0 resumed, 0 errors" in err


def _alive(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_stops_the_worker_keeps_the_rows_and_says_how_far(tmp_path):
    import os
    import signal
    import threading

    import psutil

    from trainmem import read_rows

    out, tmp = tmp_path / "sweep.jsonl", tmp_path / "tmp"
    tmp.mkdir()
    cmd = CLI + ["--model", "tiny-gpt-neox", "--device", "cpu", "--method", "measure", "--batch-size", "1,2,3",
                 "--seq-len", "64", "--steps", "4", "--num-samples", "16", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    parent, children = psutil.Process(proc.pid), []
    deadline = time.time() + 180
    while time.time() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.05)
    while time.time() < deadline and not children:  # the next point's worker
        children = parent.children(recursive=True)
        time.sleep(0.05)
    assert children and list(tmp.glob("trainmem-*")), "a worker should be running, in its temp folder"
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    proc.send_signal(signal.SIGTERM)
    err = ""
    for line in proc.stderr:  # the closing line comes once the sweep has unwound: the worker must be gone by then
        err += line
        if "interrupted" in line:
            break
    left = [c.pid for c in children if _alive(c)]
    err += proc.stderr.read()
    proc.wait()
    watchdog.cancel()
    problems: list = []
    rows = read_rows(out, problems)
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert f"trainmem sweep: interrupted after {len(rows)} of 3 points; rerun with --resume" in " ".join(err.split())
    assert problems == [] and 1 <= len(rows) < 3 and {r["status"] for r in rows} == {"ok"}
    assert left == [], "the worker outlived the sweep's unwinding"
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp) in " ".join(p.info["cmdline"] or [])]
    assert list(tmp.glob("trainmem-*")) == [] and not (tmp_path / "sweep.jsonl.lock").exists()


def test_models_that_read_values_on_the_host_sweep_beside_a_working_model(tmp_path):
    """OPT, BioGPT and a BigBird decoder read values of their masks and inputs on the host, which the meta
    device cannot hold: each estimates (simulate, none falling back), and a sweep over them and a working model
    writes every point."""
    from transformers import CONFIG_MAPPING

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 vocab_size=1024, max_position_embeddings=512)
    models = []
    for model_type, extra in (("opt", dict(ffn_dim=128, word_embed_proj_dim=64)), ("biogpt", {}),
                              ("big_bird", dict(is_decoder=True, attention_type="original_full"))):
        fields = {k: v for k, v in {**small, **extra}.items() if hasattr(CONFIG_MAPPING[model_type](), k)}
        path = tmp_path / f"{model_type}.json"
        path.write_text(json.dumps({"model_type": model_type, **fields}))
        models.append(str(path))
    out = tmp_path / "sweep.jsonl"
    p = subprocess.run(CLI + ["--model", ",".join(models + ["tiny-llama"]), "--seq-len", "32", "--batch-size", "2",
                              "--method", "estimate", "--estimator", "simulate", "--out", str(out)],
                       capture_output=True, text=True)
    rows = _rows(out)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert [r["status"] for r in rows] == ["ok"] * 4 and [r["method"] for r in rows] == ["simulate"] * 4
