"""`trainmem report` on the committed sample: the chapter's 14 H200 measurements and their estimates."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.output.report import load_rows, tables, write_report

SAMPLE = Path(__file__).parents[1] / "data" / "chapter-sample.jsonl"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return write_report(SAMPLE, tmp_path_factory.mktemp("report"), gpu="T4")


def test_report_package_never_imports_torch():
    code = "import trainmem.output.report, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_still_load_lazily():
    code = ("import sys, trainmem; assert 'torch' not in sys.modules; trainmem.run, trainmem.Breakdown; "
            "from trainmem.estimator import analytic; assert callable(trainmem.estimate), trainmem.estimate")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_measurement_and_estimate_pair_per_setup():
    comparison = tables.compare(load_rows(SAMPLE))
    assert len(comparison) == 14
    first, qlora_t4, oom = comparison[0], comparison[13], comparison[9]
    assert (first["label"], first["measured_peak_allocated"], first["estimated_peak_allocated"],
            first["estimate_method"], first["error_pct"]) == ("b4 fp16", 13391504896, 13385213328, "simulate", -0.05)
    assert (qlora_t4["label"], qlora_t4["measured_peak_allocated"], qlora_t4["estimated_peak_allocated"],
            qlora_t4["estimate_method"], qlora_t4["error_pct"], qlora_t4["estimate_fits"]) == (
        "b16 qlora ckpt fp16 @T4", 3526678016, 3603945920, "analytic", 2.19, True)
    # the chapter's OOM: no measured peak to compare, and the estimate says it does not fit the T4
    assert (oom["label"], oom["measured_status"], oom["error_pct"], oom["estimate_fits"]) == (
        "b16 fp16 @T4", "oom", None, False)


def test_csv_and_markdown(report):
    with open(report["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 14 and list(rows[0]) == list(tables.COLUMNS)
    assert rows[2]["batch_size"] == "16" and rows[2]["measured_peak_allocated"] == "16828975616"
    assert rows[2]["estimated_peak_allocated"] == "16825738648" and rows[2]["error_pct"] == "-0.02"
    md = report["md"].read_text()
    assert "| polyglot-ko-1.3b | b16 fp16 | ok | 15.673 | simulate (ok) | 15.670 | -0.0% |  | 45870 |" in md
    assert "| polyglot-ko-1.3b | b16 fp16 @T4 | oom |  | simulate (ok) | 15.670 |  | no |  |" in md
    assert "![breakdown](breakdown.png)" in md
    assert "## The chapter's published figures" in md and "| batch 8 | 11.113 (book text: 11.228) |" in md


def test_chapter_figures_beside_trainmems():
    lines = tables.chapter(load_rows(SAMPLE))
    assert [c["run"] for c in lines] == ["batch 4", "batch 8", "batch 16", "batch 4, accumulation 4",
                                         "batch 16, checkpointing", "batch 16, LoRA", "batch 16, QLoRA"]
    b4, b16, lora = lines[0], lines[2], lines[5]
    # the T4 rows win over the unconstrained ones: the verdict is the T4's
    assert (b4["book_first_step"], b4["book_optimizer"], b4["optimizer"], b4["measured"], b4["level"], b4["gpu"]) == (
        10.586, 4.961, 5327242384, 13391504896, "fits", "T4")
    assert (b16["book_first_step"], b16["measured"], b16["measured_status"], b16["level"]) == (None, None, "oom", "no")
    assert lora["book_optimizer"] == 0.006 and "fp32" in lora["why"]
    head, body = tables.chapter_display(lines)
    assert body[2][:2] == ["batch 16", "out of memory (12.164 reached)"]
    assert all(cells[-1] for cells in body)  # one sentence per row on why the figures differ


def test_plots_are_real_pngs(report):
    from matplotlib.image import imread

    for name in ("breakdown", "batch", "throughput"):
        data = report[name].read_bytes()
        assert data[:8] == PNG and len(data) > 10_000, name
        image = imread(report[name])
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0, name


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium here (apt-get install chromium)")
def test_html_renders_in_a_headless_browser(report):
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          report["html"].resolve().as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    for section in ('id="summary"', 'id="comparison"', 'id="comparison-table"', 'id="plots"',
                    'id="plot-breakdown"', 'id="plot-batch"', 'id="plot-throughput"'):
        assert section in dom, section
    assert 'data-decoded-plots="3"' in dom  # the browser decoded the three inlined PNGs
    assert 'id="chapter-table"' in dom
    assert dom.count("<tr>") == 15 + 8 and "b16 qlora ckpt fp16 @T4" in dom  # + the chapter's header and 7 runs


def test_cli_report_and_its_errors(tmp_path):
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "trainmem.cli", "report", str(SAMPLE), "--out", str(out)],
                       capture_output=True, text=True, check=True)
    assert "html:" in p.stdout and (out / "report.html").stat().st_size > 50_000
    bad = subprocess.run([sys.executable, "-m", "trainmem.cli", "report", str(tmp_path / "none.jsonl"),
                          "--gpu", "T5"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "FILE.jsonl: no such file" in bad.stderr and "--gpu: unknown card 'T5'" in bad.stderr


def test_lines_that_are_not_rows_are_counted_and_located(tmp_path):
    from trainmem import read_rows

    rows = SAMPLE.read_text().splitlines()[:3]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([rows[0], "garbage", rows[1], '{"schema": "trainmem.result/1", "kind": "estimate"}',
                                "[1, 2]", rows[2], "", '{"schema": "trainmem.result/0"}', '{"kind": "measure']))
    problems: list = []
    assert read_rows(mixed, problems) == read_rows(mixed) == [json.loads(r) for r in rows]
    assert [(p.line, p.reason) for p in problems] == [
        (2, "not JSON at column 1: Expecting value"), (4, "no model name"), (5, "a JSON list, not an object"),
        (8, "schema 'trainmem.result/0', not 'trainmem.result/1'"),
        (9, "not JSON at column 10: Unterminated string starting at, the last line, cut short")]
    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "trainmem.cli", "report", str(mixed), "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert (out / "report.html").exists() and len(list(csv.DictReader((out / "report.csv").open()))) == 3
    assert (f"warning: left out 5 unreadable lines: {mixed}:2 (not JSON at column 1: Expecting value), "
            f"{mixed}:4 (no model name), {mixed}:5 (a JSON list, not an object) and 2 more") in " ".join(p.stderr.split())
