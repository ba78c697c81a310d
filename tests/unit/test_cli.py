"""The real `trainmem run` command on a tiny preset on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "trainmem.cli"]
TINY = ["--model", "tiny-gpt-neox", "--batch-size", "2", "--seq-len", "32", "--steps", "2", "--num-samples", "8"]


def test_run_json_and_out_file(tmp_path):
    out = tmp_path / "results.jsonl"
    for _ in range(2):
        p = subprocess.run(CLI + ["run", *TINY, "--json", "--out", str(out)], capture_output=True, text=True, check=True)
    row = json.loads(p.stdout)
    assert row["schema"] == "trainmem.result/1" and row["status"] == "ok" and row["kind"] == "measurement"
    assert set(row["memory"]) == {"weights", "gradients", "optimizer", "activations", "other",
                                  "peak_allocated", "peak_reserved", "device_used"}
    assert row["setup"]["device"] == "cpu" and row["setup"]["precision"] == "fp32"
    assert row["env"]["torch"] and row["throughput"]["timed_steps"] == 2
    assert any("throughput includes the probed steps" in n for n in row["notes"])
    assert len(out.read_text().splitlines()) == 2


def test_run_prints_the_breakdown_table():
    p = subprocess.run(CLI + ["run", *TINY, "--phases"], capture_output=True, text=True, check=True)
    assert "Memory at the peak" in p.stdout and "step2.optimizer" in p.stdout and "status: ok" in p.stdout


def test_yaml_config_with_flag_override(tmp_path):
    cfg = tmp_path / "setup.yaml"
    cfg.write_text("model: tiny-llama\nbatch_size: 3\nseq_len: 16\nsteps: 2\nnum_samples: 6\npeft: lora\n")
    p = subprocess.run(CLI + ["run", "--config", str(cfg), "--batch-size", "2", "--json"],
                       capture_output=True, text=True, check=True)
    row = json.loads(p.stdout)
    assert row["model"]["name"] == "tiny-llama" and row["setup"]["peft"] == "lora"
    assert row["setup"]["batch_size"] == 2 and row["setup"]["seq_len"] == 16


def test_bad_flags_are_reported_together(tmp_path):
    p = subprocess.run(CLI + ["run", "--batch-size", "x", "--grad-accum", "0", "--gpu", "T5", "--memory-cap", "lots",
                              "--data", str(tmp_path / "none.txt")], capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    for needle in ("--batch-size: expected a whole number, got 'x'", "--grad-accum: must be a whole number >= 1",
                   "--gpu: unknown card 'T5'", "--memory-cap: 'lots' is not a size", "--data: no such file"):
        assert needle in p.stderr, p.stderr


def test_oom_under_a_cap_is_a_result_not_a_traceback():
    p = subprocess.run(CLI + ["run", *TINY, "--memory-cap", "2MiB", "--json"], capture_output=True, text=True)
    assert p.returncode == 0 and "Traceback" not in p.stderr
    row = json.loads(p.stdout)
    assert row["status"] == "oom" and row["oom"]["tried_to_allocate"] > 0


def test_default_run_on_the_cpu_says_what_it_ran_and_estimates_the_seed():
    p = subprocess.run(CLI + ["run", "--batch-size", "2", "--seq-len", "32", "--steps", "2", "--num-samples", "4"],
                       capture_output=True, text=True, check=True)
    text = " ".join(p.stdout.split())
    assert "ran the tiny preset tiny-gpt-neox on the CPU" in text
    assert "the seed's run (polyglot-ko-1.3b, batch 4 x 256, fp16, AdamW) on a T4" in text and "fits" in text


def test_estimate_a_hub_model_fetches_its_config_then_works_offline(fake_hub, tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=fake_hub.url, HF_HOME=str(tmp_path / "hf-home"))
    cmd = CLI + ["estimate", "--model", "acme/tiny-llama", "--method", "analytic", "--json"]
    first = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    assert first["model"]["name"] == "acme/tiny-llama" and first["model"]["source"] == "hub"
    assert first["model"]["parameters"] == 223_552
    # files asked for: config.json only, never weights (huggingface_hub may also GET its own /api/ registries)
    assert {p.rsplit("/", 1)[1] for _, p, _ in fake_hub.requests if "resolve" in p} == {"config.json"}
    fake_hub.stop()
    offline = subprocess.run(cmd, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=True)
    assert json.loads(offline.stdout)["memory"] == first["memory"]
    gated = subprocess.run(CLI + ["estimate", "--model", "acme/gated-llama"], env={**env, "HF_HUB_OFFLINE": "1"},
                           capture_output=True, text=True)
    assert gated.returncode == 2 and "Traceback" not in gated.stderr
    assert ("--model: 'acme/gated-llama' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
            in " ".join(gated.stderr.split()))


def _bad_outs(tmp_path):
    """An --out that is a folder, and one under a file (a folder that cannot be made): each command's flag."""
    (tmp_path / "a-file").write_text("not a folder\n")
    folder, under_file = tmp_path, tmp_path / "a-file" / "rows.jsonl"
    return [(folder, f"--out: {folder} is a folder; pass a file in it, e.g. --out {folder / 'results.jsonl'}"),
            (under_file, f"--out: {tmp_path / 'a-file'} is a file, not a folder; pass --out a path in a folder")]


def test_a_bad_out_stops_every_command_before_any_work(tmp_path):
    import time

    outs = _bad_outs(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    commands = [["run", *TINY], ["estimate", *TINY], ["sweep", *TINY, "--batch-size", "1,2"]]
    for out, message in outs:
        for command in commands:
            started = time.time()
            p = subprocess.run(CLI + command + ["--out", str(out)], capture_output=True, text=True)
            took = time.time() - started
            assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == "", p.stderr
            assert message in " ".join(p.stderr.split()), p.stderr
            assert took < 3, f"{command[0]} took {took:.1f} s: it should stop before loading the setup"
    sample = Path(__file__).parents[1] / "data" / "chapter-sample.jsonl"
    report = subprocess.run(CLI + ["report", str(sample), "--out", str(tmp_path / "a-file")],
                            capture_output=True, text=True)
    assert report.returncode == 2 and "Traceback" not in report.stderr
    assert f"--out: {tmp_path / 'a-file'} is a file, not a folder" in " ".join(report.stderr.split())
    assert sorted(tmp_path.rglob("*")) == before  # not a row, not a lock file written


def test_an_estimate_asked_again_is_answered_from_disk_without_torch(tmp_path):
    """The same question of the same trainmem and libraries: the kept answer, the same bytes, no torch import;
    another flag, another key."""
    import os

    env = {**os.environ, "TRAINMEM_CACHE": "on", "TRAINMEM_CACHE_DIR": str(tmp_path)}
    ask = ["estimate", "--model", "tiny-llama", "--gpu", "T4", "--json"]
    code = ("import sys\nfrom trainmem.cli import main\nassert main({args!r}) == 0\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    first = subprocess.run([sys.executable, "-c", code.format(args=ask)], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert len(list(tmp_path.glob("*.json"))) == 1
    again = subprocess.run([sys.executable, "-c", code.format(args=ask)], env=env, capture_output=True, text=True)
    assert again.stdout == first.stdout and again.stderr.strip().splitlines()[-1] == "False"
    other = subprocess.run([sys.executable, "-c", code.format(args=ask + ["--batch-size", "2"])], env=env,
                           capture_output=True, text=True)
    assert other.returncode == 0 and other.stdout != first.stdout and len(list(tmp_path.glob("*.json"))) == 2
