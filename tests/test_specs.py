import json

import pytest

from trainmem import ModelSpec, SetupError
from trainmem.specs import PRESETS

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


def test_unknown_hub_id_says_how_to_pass_a_local_model():
    with pytest.raises(SetupError) as e:
        ModelSpec.resolve("someone/not-cached-model")
    msg = str(e.value)
    assert "local Hugging Face cache" in msg and "save_pretrained" in msg and "config.json" in msg


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
