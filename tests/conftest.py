"""Shared fixtures: a real local model folder (config, weights, trained tokenizer) and a GPU marker."""

from __future__ import annotations

import os

import pytest
import torch

# estimate's answers kept on disk (trainmem.cli.cache) would let one test's answer stand for another's
# monkeypatched code; tests/unit/test_cli.py turns the cache on where it tests it
os.environ.setdefault("TRAINMEM_CACHE", "off")


SLOW_TIERS = ("slow", "regression")
"""Test folders whose every test is `slow`: the README's command leaves them out, CI runs them after it."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "memory of batch four, effect of batch sixteen",
    "gradient accumulation sums gradients over micro batches",
    "a short line",
    "optimizer states take twice the weights with adam in the same dtype as the parameters",
    "checkpointing keeps layer inputs and recomputes the rest",
] * 4


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny Llama saved with `save_pretrained`, with a word-level tokenizer trained on TEXTS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama-dir")
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=len(fast), max_position_embeddings=128,
                      pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "train.txt"
    p.write_text("\n".join(TEXTS) + "\n")
    return p


# --- a stand-in for the Hugging Face Hub ---------------------------------------------------------------
TINY_LLAMA_CONFIG = {  # a real config.json of a 2-layer Llama, as save_pretrained writes one
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "dtype": "bfloat16", "transformers_version": "5.17.0",
}


class FakeHub:
    """What `hf_hub_download` talks to, on 127.0.0.1: `HEAD/GET /{repo}/resolve/{revision}/{file}` answers a
    307 to `/api/resolve-cache/models/{repo}/{commit}/{file}` with X-Repo-Commit and ETag, as the Hub does
    for files not in LFS; errors carry the Hub's X-Error-Code (GatedRepo, RepoNotFound, RevisionNotFound,
    EntryNotFound) that huggingface_hub turns into its error types."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"
    TOKEN = "hf_test_token"

    def __init__(self, files: dict[str, dict[str, bytes]], gated: set[str]):
        import http.server
        import threading

        self.files, self.gated, self.requests = files, gated, []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):
                hub.answer(self, with_body=False)

            def do_GET(self):
                hub.answer(self, with_body=True)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.deadline = threading.Timer(300, self.stop)  # stops by itself if a test never does
        self.deadline.start()

    def stop(self):
        self.deadline.cancel()
        self.server.shutdown()
        self.server.server_close()

    def answer(self, req, with_body: bool):
        import re
        from urllib.parse import unquote, urlsplit

        path = unquote(urlsplit(req.path).path)
        self.requests.append((req.command, path, req.headers.get("Authorization")))
        m = (re.fullmatch(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", path)
             or re.fullmatch(r"/api/resolve-cache/models/(?P<repo>[^/]+/[^/]+)/(?P<rev>[0-9a-f]{40})/(?P<file>.+)", path))
        if m is None or m["repo"] not in self.files:
            return self.send(req, 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
        if m["repo"] in self.gated and req.headers.get("Authorization") != f"Bearer {self.TOKEN}":
            return self.send(req, 401, {"X-Error-Code": "GatedRepo", "X-Error-Message":
                                        f"Access to model {m['repo']} is restricted. Please log in."})
        if m["rev"] not in ("main", self.COMMIT):
            return self.send(req, 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"})
        commit = {"X-Repo-Commit": self.COMMIT}
        body = self.files[m["repo"]].get(m["file"])
        if body is None:
            return self.send(req, 404, {**commit, "X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
        import hashlib

        etag = {"ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
        if "/resolve/" in path:
            location = f"/api/resolve-cache/models/{m['repo']}/{self.COMMIT}/{m['file']}"
            return self.send(req, 307, {**commit, **etag, "Location": location})
        self.send(req, 200, {**commit, **etag, "Content-Type": "application/json"}, body if with_body else None,
                  len(body))

    @staticmethod
    def send(req, status: int, headers: dict[str, str], body: bytes | None = None, length: int = 0):
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(length))
        req.end_headers()
        if body:
            req.wfile.write(body)


@pytest.fixture
def fake_hub():
    """A local Hub with `acme/tiny-llama` (public), `acme/gated-llama` (needs FakeHub.TOKEN) and
    `acme/no-config` (a repo without config.json); any other repo is missing (404)."""
    import json

    config = json.dumps(TINY_LLAMA_CONFIG, indent=2).encode()
    hub = FakeHub({"acme/tiny-llama": {"config.json": config}, "acme/gated-llama": {"config.json": config},
                   "acme/no-config": {"README.md": b"# no model here\n"}}, gated={"acme/gated-llama"})
    yield hub
    hub.stop()


@pytest.fixture
def hub_at(monkeypatch, tmp_path):
    """Point this process's huggingface_hub at `endpoint` with an empty cache, as HF_ENDPOINT and HF_HOME
    would at start-up (huggingface_hub reads them at import), and with HF_HUB_OFFLINE off."""
    import huggingface_hub.constants as c

    def point(endpoint: str, offline: bool = False) -> None:
        monkeypatch.setattr(c, "ENDPOINT", endpoint)
        monkeypatch.setattr(c, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(c, "HF_HUB_OFFLINE", offline)
        monkeypatch.delenv("HF_TOKEN", raising=False)

    return point
