"""`trainmem serve` in a real browser: the CLI starts the server, Playwright drives Debian's headless Chromium.

Skipped where there is no `chromium` (`apt-get install chromium`; CI's .ci/run installs it) or no playwright
(the test extra installs it; Playwright's own browser download is not used). Only loopback traffic: the
server listens on 127.0.0.1 and the page asks only it. With TRAINMEM_SCREENSHOTS=DIR the views are saved
as PNGs there (docs/guide/serve-*.png are made so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from trainmem.hardware.gpus import CATALOG

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright (pip install -e '.[test]')")
SAMPLE = Path(__file__).parents[1] / "data" / "chapter-sample.jsonl"
SHOTS = os.environ.get("TRAINMEM_SCREENSHOTS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trainmem.cli", "serve", "--port", str(port), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < end, "trainmem serve did not start in 120 s"
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
        tab = context.new_page()
        tab.goto(server)
        yield tab
        browser.close()


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(1500)  # a frame just scrolled into view paints a moment later
        page.screenshot(path=str(Path(SHOTS) / f"serve-{name}.png"), full_page=False)


def row(page, card: str):
    return page.locator(f'#cards-table tr[data-card="{card}"]')


def timed(page, change, ready: str) -> float:
    """Seconds from a change of the form until the page shows its answer (`ready` appears)."""
    start = time.monotonic()
    change()
    page.wait_for_selector(ready, timeout=30_000)
    return time.monotonic() - start


def test_the_chapter_on_every_card_in_a_browser(page, tmp_path):
    # the chapter's batch-16 setup, filled in as a user would
    page.fill("#model", "polyglot-ko-1.3b")
    page.select_option("#peft", "none")
    page.select_option("#precision", "fp16")
    page.select_option("#optimizer", "adamw")
    page.fill("#seq_len", "256")
    page.fill("#grad_accum", "1")
    page.fill("#batch_size", "16")
    page.select_option("#card", "T4")
    page.wait_for_selector('#cards-table[data-batch="16"] tr[data-card="T4"]', timeout=120_000)
    assert row(page, "T4").get_attribute("data-level") == "no"  # the chapter's OOM
    page.wait_for_selector('tr[data-card="T4"][data-method="simulate"]', timeout=240_000)
    assert row(page, "T4").get_attribute("data-level") == "no"
    assert row(page, "A100-40GB").get_attribute("data-level") == "fits"
    assert page.locator("#cards-table .badge").count() == 1  # the smallest card that fits, marked
    assert page.locator("#chosen #bar rect").count() == 7  # the parts, the cache and the outside, stacked
    shot(page, "cards")

    batch = timed(page, lambda: page.fill("#batch_size", "8"), '#cards-table[data-batch="8"]')
    assert row(page, "T4").get_attribute("data-level") == "fits"  # batch 8 fits the T4, as in the chapter
    card = timed(page, lambda: page.select_option("#card", "A100-40GB"), '#chosen[data-card="A100-40GB"]')
    print(f"\npage updated after a change of micro-batch in {batch:.2f} s, of card in {card:.2f} s (goal: < 1 s)")
    assert batch < 5 and card < 5  # generous: the goal, < 1 s, is measured and printed, not asserted
    page.select_option("#card", "T4")
    page.wait_for_selector('#chosen[data-card="T4"]')
    page.wait_for_selector('tr[data-card="T4"][data-method="simulate"]', timeout=240_000)
    page.evaluate("document.querySelector('#breakdown').scrollIntoView()")
    shot(page, "breakdown")

    with page.expect_download() as download:
        page.click("#download")
    body = json.loads(Path(download.value.path()).read_text())
    assert body["card"] == "T4" and body["setup"]["batch_size"] == 8 and len(body["cards"]) == len(CATALOG)
    assert body["result"]["verdict"]["gpu"] == "T4" and body["result"]["verdict"]["level"] == "fits"

    page.fill("#target", "16")
    page.click("#plan-button")
    page.wait_for_selector("#plan-progress progress", timeout=30_000)  # the progress while it searches
    page.wait_for_selector("#winner-command", timeout=300_000)
    assert page.inner_text("#winner-command").startswith("trainmem run --model polyglot-ko-1.3b")
    assert "TrainingArguments(" in page.inner_text("#winner-args")
    page.locator("#plan").scroll_into_view_if_needed()
    shot(page, "plan")

    page.set_input_files("#rows-file", str(SAMPLE))
    page.wait_for_selector("#report:not([hidden])", timeout=120_000)
    report = page.frame_locator("#report")
    report.locator("#comparison-table").wait_for(timeout=60_000)
    assert report.locator("#comparison-table tbody tr").count() == 14
    assert page.locator("#timeline svg rect").count() > 10
    page.evaluate("document.querySelector('#measured').scrollIntoView()")
    shot(page, "report")

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}))
    page.set_input_files("#config-file", str(config))
    # expect, not wait_for_function: the page's content-security policy forbids evaluating strings
    sync_api.expect(page.locator("#model")).to_have_value(re.compile("^upload:"), timeout=30_000)
    page.wait_for_selector('#cards-table tr[data-card="T4"][data-level="fits"]', timeout=60_000)
    bad = tmp_path / "evil.json"
    bad.write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "evil.Model"}}))
    page.set_input_files("#config-file", str(bad))
    page.wait_for_selector("#config-problems li.problem", timeout=30_000)
    assert "trust_remote_code" in page.inner_text("#config-problems")
    assert "Traceback" not in page.content()


def test_a_hub_id_is_sent_on_enter_not_at_each_keystroke(page):
    """Typing a hub id asks nothing; Enter sends it once, and its answer (here the Hub cannot be reached, or
    has no such repository) is one line; the table it replaces is greyed and named meanwhile."""
    page.fill("#model", "tiny-llama")
    page.keyboard.press("Tab")  # leaving the field commits it
    page.wait_for_selector('#cards-table[data-model="tiny-llama"]', timeout=120_000)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/estimate" in r.url else None)
    page.click("#model")
    page.fill("#model", "")
    page.type("#model", "someone/no-such-model", delay=20)
    page.wait_for_timeout(500)
    assert not [u for u in asked if "no-such-model" in u or "someone" in u]  # no keystroke was sent
    page.keyboard.press("Enter")
    page.wait_for_selector("#problems li.problem", timeout=60_000)
    assert [u for u in asked if "someone%2Fno-such-model" in u]
    assert "someone/no-such-model" in page.inner_text("#problems") and "Traceback" not in page.content()
    page.fill("#model", "tiny-llama")
    page.keyboard.press("Enter")
    page.wait_for_selector('#cards-table[data-model="tiny-llama"]', timeout=60_000)
    page.fill("#batch_size", "3")  # a new setup: the old table greyed and named until its answer is in
    sync_api.expect(page.locator("#cards-table")).to_have_attribute("data-batch", "3", timeout=60_000)
    assert page.locator("#cards.replacing").count() == 0 and page.locator("#replacing").is_hidden()
    assert "micro-batch 3 x" in page.inner_text("#cards-table caption")
