"""Shared fixtures: a real local model folder (config, weights, trained tokenizer) and a GPU marker."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
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
