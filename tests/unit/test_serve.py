"""`trainmem serve`'s routes through Starlette's test client: answers, validation, uploads, errors as one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import trainmem  # noqa: E402
from trainmem.config.presets import PRESETS  # noqa: E402
from trainmem.serve import create_app  # noqa: E402
from trainmem.serve.workers import Workers  # noqa: E402

SAMPLE = Path(__file__).parents[1] / "data" / "chapter-sample.jsonl"
TINY = {"model": "tiny-llama", "batch_size": "2", "seq_len": "32", "precision": "fp16", "card": "T4"}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(processes=1, warm=False), raise_server_exceptions=False) as c:
        yield c


def settled(client, params, seconds=180):
    """Ask until the simulation of every runtime group is in (the page polls the same way)."""
    end = time.monotonic() + seconds
    while True:
        got = client.get("/api/estimate", params=params)
        assert got.status_code == 200, got.text
        if not got.json()["pending"] or time.monotonic() > end:
            return got.json()
        time.sleep(0.5)


def one_line_each(problems):
    assert problems and all(isinstance(p, str) and "\n" not in p and "Traceback" not in p for p in problems)
    return problems


def test_the_page_has_the_form_and_every_card(client):
    page = client.get("/")
    assert page.status_code == 200 and "Content-Security-Policy" in page.headers
    for field in ("model", "peft", "lora_r", "precision", "optimizer", "batch_size", "grad_accum", "seq_len",
                  "checkpointing", "gpus", "shard", "card", "config-file", "rows-file", "plan-button"):
        assert f'id="{field}"' in page.text, field
    assert all(f'value="{name}"' in page.text for name in trainmem.GPUS)
    assert client.get("/static/serve.js").status_code == 200


def test_every_card_analytic_at_once_then_simulated(client):
    first = client.get("/api/estimate", params=TINY).json()
    assert len(first["rows"]) == len(trainmem.GPUS) and first["groups"] == 3
    assert {r["method"] for r in first["rows"]} <= {"analytic", "simulate"}
    assert 'id="cards-table" data-batch="2"' in first["html"]["cards"]
    done = settled(client, TINY)
    assert done["pending"] == 0 and {r["method"] for r in done["rows"]} == {"simulate"}
    spec = trainmem.ModelSpec.resolve("tiny-llama")
    setup = trainmem.TrainSetup(batch_size=2, seq_len=32, precision="fp16")
    for row in done["rows"]:  # the table is trainmem.estimate with that card, the same method
        v = trainmem.estimate(spec, setup.replace(gpu=row["card"])).verdict(row["card"])
        assert (row["level"], row["headroom"]) == (v["level"], v["headroom"]), row["card"]
        assert row["time"]["step_s"] > 0 and row["max_batch"] > 2
    smallest = [r["card"] for r in done["rows"] if r["smallest_that_fits"]]
    assert smallest == ["RTX-3060-12GB"]  # the catalog's smallest card, capacity standing for price
    assert 'data-card="T4"' in done["html"]["breakdown"] and "<svg" in done["html"]["breakdown"]


def test_a_change_of_card_or_micro_batch_is_answered_from_the_cache(client):
    settled(client, TINY)
    start = time.monotonic()
    other = client.get("/api/estimate", params={**TINY, "card": "A100-40GB"}).json()
    assert time.monotonic() - start < 1.0 and other["pending"] == 0  # nothing to compute: every card is known
    assert 'data-card="A100-40GB"' in other["html"]["breakdown"]
    start = time.monotonic()
    more = client.get("/api/estimate", params={**TINY, "batch_size": "3"}).json()
    print(f"micro-batch change: {time.monotonic() - start:.2f} s (analytic, simulation in the background)")
    assert more["batch_size"] == 3 and all(r["method"] in ("analytic", "simulate") for r in more["rows"])


def test_bad_input_is_every_problem_at_once_one_line_each(client):
    got = client.get("/api/estimate", params={**TINY, "batch_size": "abc", "seq_len": "999999", "peft": "x",
                                              "precision": "bf16", "card": "T5"})
    assert got.status_code == 422
    problems = one_line_each(got.json()["problems"])
    text = " | ".join(problems)
    for expected in ("--batch-size: expected a whole number, got 'abc'", "--seq-len: at most 131072",
                     "--peft: 'x' is not one of none, lora, qlora", "--gpu: unknown card 'T5'"):
        assert expected in text
    long = client.get("/api/estimate", params={**TINY, "seq_len": "4096"})  # the CLI's rule: the model's positions
    assert long.status_code == 422 and "--seq-len: 4096 is longer than tiny-llama's" in long.json()["problems"][0]


@pytest.mark.parametrize("model", ["/etc/passwd", "../secrets", "~/model", "src/trainmem/../x", "a b"])
def test_no_local_path_is_read(client, model):
    got = client.get("/api/estimate", params={**TINY, "model": model})
    assert got.status_code == 422 and "local paths are not read" in got.json()["problems"][0]


def test_a_hub_id_goes_to_the_hub_and_its_failure_is_one_line(client, monkeypatch):
    def offline(name):
        raise trainmem.SetupError([f"--model: {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE "
                                   "is set"])

    monkeypatch.setattr(trainmem.ModelSpec, "from_hub_cache", classmethod(lambda cls, name: None))
    monkeypatch.setattr(trainmem.ModelSpec, "from_hub", classmethod(lambda cls, name: offline(name)))
    got = client.get("/api/estimate", params={**TINY, "model": "someone/not-cached"})
    assert got.status_code == 422 and "HF_HUB_OFFLINE" in one_line_each(got.json()["problems"])[0]
    preset = client.get("/api/estimate", params={**TINY, "model": "EleutherAI/polyglot-ko-1.3b", "seq_len": "64"})
    assert preset.status_code == 200  # a preset's hub id is the preset: no network


def test_an_uploaded_config_is_data_and_custom_code_is_refused(client):
    config = dict(PRESETS["tiny-llama"])
    sent = client.post("/api/config", json={"name": "my config.json", "text": json.dumps(config)})
    model = sent.json()["model"]
    assert sent.status_code == 200 and model.startswith("upload:")
    got = client.get("/api/estimate", params={**TINY, "model": model})
    assert got.status_code == 200 and len(got.json()["rows"]) == len(trainmem.GPUS)
    refused = {"custom code": {**config, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}},
               "unknown architecture": {**config, "model_type": "not-a-model"},
               "too deep": {**config, "num_hidden_layers": 100000}}
    for why, bad in refused.items():
        r = client.post("/api/config", json={"name": "config.json", "text": json.dumps(bad)})
        assert r.status_code == 422, why
        one_line_each(r.json()["problems"])
    assert "trust_remote_code" in client.post("/api/config", json={"text": json.dumps(refused["custom code"])}).text
    assert "not JSON" in client.post("/api/config", json={"text": "{model_type: llama"}).json()["problems"][0]
    huge = client.post("/api/config", json={"text": " " * (3 * 2**20)})
    assert huge.status_code == 413
    gone = client.get("/api/estimate", params={**TINY, "model": "upload:0000000000000000"})
    assert "upload it again" in gone.json()["problems"][0]


def test_the_json_download_is_the_chosen_cards_result_and_every_row(client):
    got = client.get("/api/result.json", params={**TINY, "card": "L4"})
    assert got.status_code == 200 and "attachment" in got.headers["content-disposition"]
    body = got.json()
    assert body["result"]["verdict"]["gpu"] == "L4" and body["result"]["kind"] == "estimate"
    assert len(body["cards"]) == len(trainmem.GPUS) and body["setup"]["batch_size"] == 2


def test_a_jsonl_becomes_the_report_and_a_bad_one_a_message(client):
    sent = client.post("/api/report", json={"name": "chapter.jsonl", "text": SAMPLE.read_text(), "gpu": "T4"})
    assert sent.status_code == 200, sent.text
    page = client.get(sent.json()["url"])
    assert page.status_code == 200 and 'id="comparison-table"' in page.text
    assert "Content-Security-Policy" in page.headers
    assert "<svg" in sent.json()["timeline"]  # the measured rows have phases
    bad = client.post("/api/report", json={"text": "not json\n{}\n"})
    assert bad.status_code == 422 and "no trainmem result rows" in one_line_each(bad.json()["problems"])[0]
    assert client.post("/api/report", content=b"[1, 2]").status_code == 422
    assert client.get("/report/unknown").status_code == 404


def test_plan_searches_in_the_background_and_gives_the_winner(client):
    params = {**TINY, "card": "T4", "target": "4", "allow": ["checkpointing", "peft"]}
    end = time.monotonic() + 240
    while True:
        got = client.get("/api/plan", params=params)
        assert got.status_code == 200, got.text
        if not got.json()["pending"] or time.monotonic() > end:
            break
        time.sleep(0.5)
    plan = got.json()["plan"]
    assert plan["gpu"] == "T4" and plan["target_batch"] == 4 and plan["options"]
    assert plan["options"][0]["command"].startswith("trainmem run --model tiny-llama")
    assert 'id="winner-command"' in got.json()["html"] and "TrainingArguments(" in got.json()["html"]
    bad = client.get("/api/plan", params={**TINY, "target": "0", "allow": "everything"})
    assert bad.status_code == 422 and len(one_line_each(bad.json()["problems"])) == 2


def test_an_internal_error_is_one_line_without_a_traceback(client, monkeypatch):
    from trainmem.serve.answers import Answers

    def broken(self, q):
        raise RuntimeError("boom\n  File secret.py, line 1")

    monkeypatch.setattr(Answers, "estimate", broken)
    got = client.get("/api/estimate", params=TINY)
    assert got.status_code == 500
    assert got.json()["problems"] == ["internal error (RuntimeError): boom"]


def test_a_job_past_its_limit_is_killed_and_said_so():
    workers = Workers(processes=1)
    try:
        assert workers.result("slow", time.sleep, 60, limit=1.0, what="simulate") is None
        end = time.monotonic() + 60
        while (found := workers.result("slow", time.sleep, 60, limit=1.0, what="simulate")) is None:
            assert time.monotonic() < end
            time.sleep(0.2)
        assert found == ("problems", ["simulate: stopped after 1 s (trainmem serve's limit a job)"])
        assert workers.result("quick", time.sleep, 0) is None  # a fresh pool takes the next job
    finally:
        workers.close()


def test_the_command_binds_to_this_machine_by_default():
    import argparse

    from trainmem.cli import serve

    parser = argparse.ArgumentParser()
    serve.register(parser)
    args = parser.parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 7860)


def test_a_simulation_starts_when_the_page_asks_again(client):
    """A form changed key by key queues nothing: the setup's simulations start on its second ask (the poll)."""
    workers = client.app.state.serve["workers"]
    params = {**TINY, "model": "tiny-gpt-neox", "batch_size": "3"}
    first = client.get("/api/estimate", params=params).json()
    assert first["pending"] == 3 and not [k for k in workers.jobs if '"batch_size": 3' in k and "gpt-neox" in k]
    client.get("/api/estimate", params=params)
    assert len([k for k in list(workers.jobs) + list(workers.done) if "tiny-gpt-neox" in k]) == 3
