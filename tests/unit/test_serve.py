"""`trainmem serve`'s routes through Starlette's test client: answers, validation, uploads, errors as one line."""

from __future__ import annotations

import json
import threading
import time
from html import escape
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
def client():  # the Hub taken as reachable: a test that wants it offline says so
    with TestClient(create_app(processes=1, warm=False, probe=lambda endpoint: None),
                    raise_server_exceptions=False) as c:
        yield c


def answered(client, params, seconds=120):
    """Ask until the answer is in, not `waiting` for a lookup or a first answer (the page polls the same way)."""
    end = time.monotonic() + seconds
    while (got := client.get("/api/estimate", params=params)).status_code == 200 and got.json().get("waiting"):
        assert time.monotonic() < end, got.json()["waiting"]
    return got


def settled(client, params, seconds=180):
    """Ask until the simulation of every runtime group is in (the page polls the same way)."""
    end = time.monotonic() + seconds
    while True:
        got = answered(client, params)
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
    first = answered(client, TINY).json()
    # two runtime groups: the cards without the flash kernel, and the others (each card's own cuBLAS workspace)
    assert len(first["rows"]) == len(trainmem.GPUS) and first["groups"] == 2
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
    more = answered(client, {**TINY, "batch_size": "3"}).json()
    print(f"micro-batch change: {time.monotonic() - start:.2f} s (analytic, simulation in the background)")
    assert more["batch_size"] == 3 and all(r["method"] in ("analytic", "simulate") for r in more["rows"])


def test_bad_input_is_every_problem_at_once_one_line_each(client):
    got = answered(client, {**TINY, "batch_size": "abc", "seq_len": "999999", "peft": "x", "precision": "bf16",
                            "card": "T5"})
    assert got.status_code == 422
    problems = one_line_each(got.json()["problems"])
    text = " | ".join(problems)
    for expected in ("--batch-size: expected a whole number, got 'abc'", "--seq-len: at most 131072",
                     "--peft: 'x' is not one of none, lora, qlora", "--gpu: unknown card 'T5'"):
        assert expected in text
    long = answered(client, {**TINY, "seq_len": "4096"})  # the CLI's rule: the model's positions
    assert long.status_code == 422 and "--seq-len: 4096 is longer than tiny-llama's" in long.json()["problems"][0]


@pytest.mark.parametrize("model", ["/etc/passwd", "../secrets", "~/model", "src/trainmem/../x", "a b"])
def test_no_local_path_is_read(client, model):
    got = answered(client, {**TINY, "model": model})
    assert got.status_code == 422 and "local paths are not read" in got.json()["problems"][0]


def test_a_hub_id_goes_to_the_hub_and_its_failure_is_one_line(client, monkeypatch):
    def offline(name):
        raise trainmem.SetupError([f"--model: {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE "
                                   "is set"])

    monkeypatch.setattr(trainmem.ModelSpec, "from_hub_cache", classmethod(lambda cls, name: None))
    monkeypatch.setattr(trainmem.ModelSpec, "from_hub", classmethod(lambda cls, name: offline(name)))
    got = answered(client, {**TINY, "model": "someone/not-cached"})
    assert got.status_code == 422 and "HF_HUB_OFFLINE" in one_line_each(got.json()["problems"])[0]
    preset = answered(client, {**TINY, "model": "EleutherAI/polyglot-ko-1.3b", "seq_len": "64"})
    assert preset.status_code == 200  # a preset's hub id is the preset: no network


def test_an_uploaded_config_is_data_and_custom_code_is_refused(client):
    config = dict(PRESETS["tiny-llama"])
    sent = client.post("/api/config", json={"name": "my config.json", "text": json.dumps(config)})
    model = sent.json()["model"]
    assert sent.status_code == 200 and model.startswith("upload:")
    got = answered(client, {**TINY, "model": model})
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
    gone = answered(client, {**TINY, "model": "upload:0000000000000000"})
    assert "upload it again" in gone.json()["problems"][0]


def test_the_json_download_is_the_chosen_cards_result_and_every_row(client):
    end = time.monotonic() + 120  # a first answer not in within a second is a 503 that says to ask again
    while (got := client.get("/api/result.json", params={**TINY, "card": "L4"})).status_code == 503:
        assert "download again" in got.json()["problems"][0] and time.monotonic() < end
        time.sleep(0.5)
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
        assert found == ("timeout", ["simulate: stopped after 1 s (trainmem serve's limit a job)"])
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
    first = answered(client, params).json()
    assert first["pending"] == 2 and not [k for k in workers.jobs if '"batch_size": 3' in k and "gpt-neox" in k]
    client.get("/api/estimate", params=params)
    assert len([k for k in list(workers.jobs) + list(workers.done) if "tiny-gpt-neox" in k]) == 2


def test_neither_a_pending_lookup_nor_a_first_answer_delays_a_cached_answer(client, monkeypatch):
    """A hub id is looked up in its own threads and a new setup's first answer runs on the estimator thread:
    while both are held, the page is told what is being done, and a setup seen before is answered at once."""
    answers = client.app.state.serve["answers"]
    answered(client, TINY)
    slow_hub, slow_estimate = threading.Event(), threading.Event()

    def hub(cls, name):
        slow_hub.wait(30)
        return trainmem.ModelSpec(name=name, config=dict(PRESETS["tiny-llama"]), source="hub")

    def busy():
        with answers.estimator:  # a new model's first answer, holding the estimator
            slow_estimate.wait(30)

    monkeypatch.setattr(trainmem.ModelSpec, "from_hub_cache", classmethod(lambda cls, name: None))
    monkeypatch.setattr(trainmem.ModelSpec, "from_hub", classmethod(hub))
    try:
        answers.first_thread.submit(busy)
        looking = client.get("/api/estimate", params={**TINY, "model": "someone/slow-config"}).json()
        assert looking["pending"] and "looking up someone/slow-config" in looking["waiting"]
        assert "spinner" in looking["html"]["status"] and "cards" not in looking["html"]
        first = client.get("/api/estimate", params={**TINY, "batch_size": "5"}).json()
        assert "first answer for tiny-llama" in first["waiting"]
        for params in (TINY, {**TINY, "card": "L4"}):  # seen before; a change of card is no new setup
            start = time.monotonic()
            cached = client.get("/api/estimate", params=params)
            print(f"cached answer while a lookup and a first answer wait: {time.monotonic() - start:.3f} s")
            assert cached.status_code == 200 and "rows" in cached.json() and time.monotonic() - start < 0.5
    finally:
        slow_hub.set()
        slow_estimate.set()
    got = answered(client, {**TINY, "model": "someone/slow-config"})
    assert got.status_code == 200 and 'data-model="someone/slow-config"' in got.json()["html"]["cards"]


def test_a_hub_id_without_a_network_is_one_line_at_once(client, monkeypatch):
    lookups = client.app.state.serve["answers"].lookups
    monkeypatch.setattr(lookups, "probe", lambda endpoint: "Name or service not known")
    monkeypatch.setattr(lookups, "offline", (0.0, ""))
    monkeypatch.setattr(trainmem.ModelSpec, "from_hub_cache", classmethod(lambda cls, name: None))
    monkeypatch.setattr(trainmem.ModelSpec, "from_hub", classmethod(lambda cls, name: pytest.fail("went to the Hub")))
    for model in ("someone/offline-a", "someone/offline-b"):  # the second from the kept verdict
        start = time.monotonic()
        got = answered(client, {**TINY, "model": model})
        assert got.status_code == 422 and time.monotonic() - start < 2.0
        line = one_line_each(got.json()["problems"])[0]
        assert f"--model: '{model}'" in line and "cannot be reached from it (Name or service not known)" in line


def test_the_page_sends_a_model_on_enter_or_when_the_field_is_left(client):
    """The script: the model field is committed on Enter, on leaving it, or on a pick from the list, never on a
    keystroke (test_serve_browser drives it in Chromium); the table is greyed and named while replaced."""
    js = client.get("/static/serve.js").text
    assert 'e.key === "Enter") commitModel()' in js and 'addEventListener("blur", commitModel)' in js
    assert 'if (!typed(e) && !picked(e)) later()' in js and 'k === "model" ? committed : v' in js
    assert 'classList.toggle("replacing", on)' in js and "being replaced by the answer for" in js
    assert ".replacing table" in client.get("/static/serve.css").text
    page = client.get("/").text
    assert 'id="replacing"' in page and "Enter to look up" in page
    got = answered(client, TINY).json()["html"]["cards"]
    assert "<caption>tiny-llama: micro-batch 2 x 1 accumulation, 32 tokens, full, fp16, adamw; one GPU</caption>" in got


def test_the_reason_a_card_cannot_run_is_in_its_row(client):
    got = answered(client, {**TINY, "precision": "bf16"}).json()
    t4 = next(r for r in got["rows"] if r["card"] == "T4")
    assert "no native bf16" in t4["problems"][0]
    html = got["html"]["cards"]
    row = html[html.index('<tr class="cannot chosen" data-card="T4"'):]
    row = row[:row.index("</tr>")]
    assert "can&#x27;t run" in row and f'<td class="why" colspan="5">{escape(t4["problems"][0])}</td>' in row


def test_gpus_and_nodes_are_answered_per_rank(client):
    params = {**TINY, "gpus": "4", "shard": "fsdp", "nodes": "2"}
    got = answered(client, params).json()
    assert got["ranks"] == 4 and got["groups"] == 1  # FSDP2 ranks: one simulated step for every card
    spec = trainmem.ModelSpec.resolve("tiny-llama")
    setup = trainmem.TrainSetup(batch_size=2, seq_len=32, precision="fp16", gpus=4, shard="fsdp", nodes=2)
    for row in got["rows"]:  # one rank's estimate, as `trainmem estimate --gpus 4 --shard fsdp --nodes 2` gives
        v = trainmem.estimate(spec, setup.replace(gpu=row["card"]), row["method"]).verdict(row["card"])
        assert (row["level"], row["headroom"]) == (v["level"], v["headroom"]), row["card"]
    single = answered(client, TINY).json()["rows"][0]
    assert got["rows"][0]["need"] < single["need"]  # a rank holds a quarter of the states
    assert "one rank of 4 (fsdp, 2 nodes x 2 GPUs) (HSDP" in got["html"]["cards"]
    assert "(one rank of 4, " in got["html"]["breakdown"]
    zero = answered(client, {**TINY, "gpus": "4", "shard": "zero3", "offload": "optimizer",
                             "gpus_per_node": "2", "nodes": "2"}).json()
    assert zero["groups"] == 0 and {r["method"] for r in zero["rows"]} == {"analytic"}
    assert "one rank of 4 (zero3, optimizer offloaded, 2 nodes x 2 GPUs)" in zero["html"]["cards"]
    bad = answered(client, {**TINY, "gpus": "4", "shard": "fsdp", "gpus_per_node": "3"})
    assert bad.status_code == 422
    assert one_line_each(bad.json()["problems"]) == ["--gpus 4: the world size, but --nodes 1 x --gpus-per-node 3 is "
                                                     "3; drop --gpus or make them agree"]


def test_a_timed_out_simulation_falls_back_to_the_analytic_row_with_a_retry():
    with TestClient(create_app(processes=1, warm=False, simulate_timeout=0.01, probe=lambda endpoint: None),
                    raise_server_exceptions=False) as c:
        first = answered(c, TINY).json()
        assert first["pending"] == 2 and first["timed_out"] == 0
        end = time.monotonic() + 60
        while (got := c.get("/api/estimate", params=TINY).json())["pending"]:  # the second ask starts them
            assert time.monotonic() < end
            time.sleep(0.05)
        assert got["timed_out"] == 2 and {r["method"] for r in got["rows"]} == {"analytic"}
        assert all(r["stopped"] == "simulate: stopped after 0.01 s (trainmem serve's limit a job)" for r in got["rows"])
        assert got["html"]["cards"].count("simulation timed out</span>") == len(trainmem.GPUS)
        assert 'id="retry"' in got["html"]["status"] and "retry with 0.02 s" in got["html"]["status"]
        assert "stopped after 0.01 s" in got["html"]["breakdown"] and "analytic estimate" in got["html"]["breakdown"]
        assert c.post("/api/retry", params=TINY).json() == {"retried": 2}
        again = c.get("/api/estimate", params=TINY).json()
        assert again["pending"] == 2 and again["timed_out"] == 0  # submitted again, each with twice the limit
        assert sorted(c.app.state.serve["answers"].limits.values()) == [0.02] * 2
        assert c.post("/api/retry", params={**TINY, "batch_size": "7"}).status_code == 409
