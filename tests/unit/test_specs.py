import json

import pytest

from trainmem import ModelSpec, SetupError
from trainmem.config.specs import PRESETS

# Published parameter counts (model cards / safetensors metadata of the Hugging Face checkpoints).
PUBLISHED = {
    "polyglot-ko-1.3b": 1_331_810_304,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "mistral-7b": 7_241_732_096,
    "gpt2": 124_439_808,
    "gemma-2-2b": 2_614_341_888,
    "phi-3-mini": 3_821_079_552,
    "olmo-2-1b": 1_484_916_736,
    "qwen3-0.6b": 596_049_920,
}


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_preset_parameter_counts_match_published(name, count):
    assert ModelSpec.from_preset(name).parameter_count == count


def test_every_preset_builds():
    for name in PRESETS:
        assert ModelSpec.from_preset(name).parameter_count > 0


def test_lora_r8_on_query_key_value_of_polyglot_1_3b():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    spec = ModelSpec.resolve("EleutherAI/polyglot-ko-1.3b")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(spec.hf_config())
        # target_modules=None: peft picks per architecture, query_key_value for GPT-NeoX
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=32, task_type="CAUSAL_LM"))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 24 * (2048 * 8 + 8 * 6144) == 1_572_864


def test_hub_id_of_a_preset_resolves_offline():
    spec = ModelSpec.resolve("EleutherAI/polyglot-ko-1.3b")
    assert spec.name == "polyglot-ko-1.3b" and spec.source == "preset" and not spec.has_weights
    assert spec.stored_dtype == "float16"


def test_unknown_preset_lists_presets():
    with pytest.raises(SetupError) as e:
        ModelSpec.resolve("polyglot-ko-99b")
    assert "unknown preset 'polyglot-ko-99b'" in str(e.value) and "tiny-llama" in str(e.value)


def test_hub_id_offline_and_not_cached_says_what_to_pass(hub_at):
    hub_at("http://127.0.0.1:9", offline=True)
    with pytest.raises(SetupError) as e:
        ModelSpec.resolve("someone/not-cached-model")
    msg = str(e.value)
    assert msg.startswith("- --model: 'someone/not-cached-model' is not in the local Hugging Face cache")
    assert "HF_HUB_OFFLINE is set" in msg and "save_pretrained" in msg and "config.json path" in msg


# --- configs from the Hub (tests/conftest.py's FakeHub stands in for it) ------------------------------
def test_hub_config_is_fetched_cached_and_read_offline(fake_hub, hub_at):
    from conftest import TINY_LLAMA_CONFIG

    hub_at(fake_hub.url)
    spec = ModelSpec.resolve("acme/tiny-llama")
    assert (spec.name, spec.source, spec.path, spec.has_weights) == ("acme/tiny-llama", "hub", None, False)
    # embeddings and lm_head, 2 x (q, o 64x64; k, v 64x32 for 2 KV heads; MLP 3x64x176; 2 norms), final norm
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64
    assert spec.config == TINY_LLAMA_CONFIG and spec.parameter_count == 2 * 1024 * 64 + 2 * layer + 64 == 223_552
    # config.json only, never weights: a HEAD, its same-host redirect, then one GET of the file
    assert [(m, p) for m, p, _ in fake_hub.requests] == [
        ("HEAD", "/acme/tiny-llama/resolve/main/config.json"),
        ("HEAD", f"/api/resolve-cache/models/acme/tiny-llama/{fake_hub.COMMIT}/config.json"),
        ("GET", f"/api/resolve-cache/models/acme/tiny-llama/{fake_hub.COMMIT}/config.json")]
    fake_hub.stop()
    hub_at(fake_hub.url, offline=True)
    again = ModelSpec.resolve("acme/tiny-llama")
    assert (again.name, again.source, again.config) == ("acme/tiny-llama", "hub", TINY_LLAMA_CONFIG)


def test_hub_revision(fake_hub, hub_at):
    hub_at(fake_hub.url)
    assert ModelSpec.resolve(f"acme/tiny-llama@{fake_hub.COMMIT}").name == f"acme/tiny-llama@{fake_hub.COMMIT}"
    assert fake_hub.requests[0][1] == f"/acme/tiny-llama/resolve/{fake_hub.COMMIT}/config.json"
    with pytest.raises(SetupError, match=r"--model: acme/tiny-llama has no revision 'v9'.*branch, tag or commit"):
        ModelSpec.resolve("acme/tiny-llama@v9")


def test_gated_hub_repo_needs_hf_token(fake_hub, hub_at, monkeypatch):
    hub_at(fake_hub.url)
    with pytest.raises(SetupError) as e:
        ModelSpec.resolve("acme/gated-llama")
    msg = str(e.value)
    assert "--model: acme/gated-llama is gated on the Hub" in msg and "accept its licence" in msg
    assert "set HF_TOKEN" in msg and "config.json path" in msg
    assert fake_hub.requests[-1][2] is None
    monkeypatch.setenv("HF_TOKEN", fake_hub.TOKEN)
    spec = ModelSpec.resolve("acme/gated-llama")
    assert spec.source == "hub" and spec.model_type == "llama"
    assert fake_hub.requests[-1] == ("GET", f"/api/resolve-cache/models/acme/gated-llama/{fake_hub.COMMIT}/config.json",
                                     f"Bearer {fake_hub.TOKEN}")


def test_missing_hub_repo_and_missing_config(fake_hub, hub_at):
    hub_at(fake_hub.url)
    with pytest.raises(SetupError, match=r"--model: no repository 'acme/nothing' on the Hub \(http://127\.0\.0\.1"):
        ModelSpec.resolve("acme/nothing")
    with pytest.raises(SetupError, match=r"--model: acme/no-config has no config.json on the Hub.*transformers model"):
        ModelSpec.resolve("acme/no-config")
    with pytest.raises(SetupError, match=r"--model: 'a/b/c' is neither a local path nor a hub id"):
        ModelSpec.resolve("a/b/c")


def test_unreachable_hub_says_what_to_pass_instead(hub_at, monkeypatch):
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hub_at(f"http://127.0.0.1:{port}")
    monkeypatch.setattr(time, "sleep", lambda s: None)  # huggingface_hub retries with back-off first
    with pytest.raises(SetupError) as e:
        ModelSpec.resolve("acme/tiny-llama")
    msg = str(e.value)
    assert f"the Hub (http://127.0.0.1:{port}) cannot be reached" in msg
    assert "config.json path, a local folder made by save_pretrained, or a preset" in msg


def test_config_json_and_local_dir(tmp_path, model_dir):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(PRESETS["tiny-gpt2"]))
    spec = ModelSpec.resolve(str(cfg))
    assert spec.source == "config" and spec.model_type == "gpt2" and spec.parameter_count > 0
    local = ModelSpec.resolve(str(model_dir))
    assert local.source == "dir" and local.has_weights and local.model_type == "llama"


def test_bad_config_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(SetupError, match="cannot read config"):
        ModelSpec.resolve(str(bad))
    bad.write_text("{}")
    with pytest.raises(SetupError, match="no 'model_type'"):
        ModelSpec.resolve(str(bad))


def test_config_json_infinity_is_read_as_transformers_writes_it(tmp_path):
    """save_pretrained (transformers 5) writes inf as {"__float__": "Infinity"}; the strict config class takes it
    only decoded: Mamba-2's time_step_limit is [0.0, inf]."""
    from transformers import Mamba2Config

    Mamba2Config(hidden_size=64, num_hidden_layers=1, num_heads=8, head_dim=16, vocab_size=128,
                 state_size=16, n_groups=1).save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    assert spec.config["time_step_limit"] == [0.0, float("inf")]
    assert spec.hf_config().time_step_limit == [0.0, float("inf")]


def test_composite_config_built_as_its_text_model_stays_whole_and_xlnet_has_no_position_limit(tmp_path):
    """Emu3's text config has no causal-LM class of its own (AutoModelForCausalLM builds Emu3ForCausalLM from the
    whole config): the spec keeps it whole and reads its sizes through the text config. XLNet's -1 positions
    mean no limit."""
    from lab import registry

    registry.tiny_config("emu3").save_pretrained(tmp_path / "emu3")
    spec = ModelSpec.resolve(str(tmp_path / "emu3" / "config.json"))
    assert spec.model_type == "emu3" and spec.text_config().model_type == "emu3_text_model"
    assert spec.vocab_size == 1024 and spec.max_positions == 128
    registry.tiny_config("xlnet").save_pretrained(tmp_path / "xlnet")
    assert ModelSpec.resolve(str(tmp_path / "xlnet" / "config.json")).max_positions is None


def test_hub_cache_lookup(tmp_path, monkeypatch, model_dir):
    import shutil

    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    shutil.copytree(model_dir, snap)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    spec = ModelSpec.resolve("acme/tiny")
    assert spec.source == "cache" and spec.has_weights and spec.path == str(snap)
