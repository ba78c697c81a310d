"""The MoE, hybrid and dense presets of issue 33 item 5: each builds on the meta device (no memory, no init) with
the installed transformers and has the parameter count its checkpoint publishes. The tiny twins build on CPU and
take a training step in well under a second."""

import math

import pytest
import torch

from trainmem import ModelSpec
from trainmem.config.presets import HUB_IDS, PRESETS

# Exact counts of `model.parameters()` (tied embeddings once) on the meta device, transformers 5.17. Where the
# model card rounds, the card's figure follows the count; it is what the count was checked against.
COUNTS = {
    # Mistral AI, "Mixtral of experts" (model card / announcement): 46.7B total, 12.9B active
    "mixtral-8x7b": 46_702_792_704,
    # Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    "qwen3-30b-a3b": 30_532_122_624,
    # deepseek-ai/DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated
    "deepseek-v2-lite": 15_706_484_224,
    # openai/gpt-oss-20b model card: 21B parameters (20.9B in OpenAI's model card table), 3.6B active
    "gpt-oss-20b": 20_914_757_184,
    # Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated
    "qwen1.5-moe-a2.7b": 14_315_784_192,
    # deepseek-ai/DeepSeek-V3 model card: 671B main model (685B on the Hub = + 14B of the MTP module, which
    # transformers does not build), 37B activated
    "deepseek-v3": 671_026_404_352,
    # LiquidAI/LFM2-1.2B model card: 1,170,340,608 parameters
    "lfm2-1.2b": 1_170_340_608,
    # facebook/opt-1.3b (OPT paper: 1.3B); the exact count is the Hub's safetensors total
    "opt-1.3b": 1_315_758_080,
    # bigscience/bloom-560m model card: 559,214,592 parameters
    "bloom-560m": 559_214_592,
    # tiiuae/falcon-7b model card: 7B; the Hub's safetensors total is 6.92B
    "falcon-7b": 6_921_720_704,
    # allenai/OLMoE-1B-7B-0924 model card and the OLMoE paper: 6.9B total, 1.3B active
    "olmoe-1b-7b": 6_919_161_856,
    # meta-llama/Llama-3.1-70B model card: 70.6B (the Hub's safetensors total is 70,553,706,496)
    "llama-3.1-70b": 70_553_706_496,
}

HUBS = {
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "deepseek-ai/DeepSeek-V2-Lite": "deepseek-v2-lite",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "Qwen/Qwen1.5-MoE-A2.7B": "qwen1.5-moe-a2.7b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "LiquidAI/LFM2-1.2B": "lfm2-1.2b",
    "facebook/opt-1.3b": "opt-1.3b",
    "bigscience/bloom-560m": "bloom-560m",
    "tiiuae/falcon-7b": "falcon-7b",
    "allenai/OLMoE-1B-7B-0924": "olmoe-1b-7b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
}

TINY = ["tiny-qwen3-moe", "tiny-olmoe", "tiny-mixtral", "tiny-lfm2", "tiny-granitemoehybrid"]


@pytest.mark.parametrize("name,count", COUNTS.items())
def test_parameter_count_matches_the_published_one(name, count):
    assert ModelSpec.from_preset(name).parameter_count == count


@pytest.mark.parametrize("hub_id,name", HUBS.items())
def test_hub_id_names_the_preset(hub_id, name):
    assert HUB_IDS[hub_id] == name
    spec = ModelSpec.from_preset(hub_id)
    assert spec.name == name and spec.source == "preset" and not spec.has_weights


def test_presets_keep_the_stored_dtype():
    dtypes = {name: ModelSpec.from_preset(name).stored_dtype for name in COUNTS}
    assert dtypes == {**{name: "bfloat16" for name in COUNTS}, "opt-1.3b": "float16", "bloom-560m": "float16",
                      "olmoe-1b-7b": "float32"}


def test_gpt_oss_keeps_its_attention_layout_and_drops_mxfp4():
    cfg = ModelSpec.from_preset("gpt-oss-20b").hf_config()
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 12 and cfg.sliding_window == 128
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 32.0
    assert "quantization_config" not in PRESETS["gpt-oss-20b"]


def test_lfm2_puts_attention_where_the_checkpoint_does():
    cfg = ModelSpec.from_preset("lfm2-1.2b").hf_config()
    attention = [i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention"]
    assert attention == [2, 5, 8, 10, 12, 14] and len(cfg.layer_types) == 16


@pytest.mark.parametrize("name", TINY)
def test_tiny_preset_takes_a_training_step_on_cpu(name):
    from transformers import AutoModelForCausalLM

    spec = ModelSpec.from_preset(name)
    cfg = spec.hf_config()
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, spec.stored_dtype) == (64, 2, 1024, "float32")
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if name != "tiny-lfm2":
        assert (experts, cfg.num_experts_per_tok) == (4, 2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == spec.parameter_count
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None for n, p in model.named_parameters() if "embed" in n)
