"""Built-in models: the exact architecture fields of published checkpoints' config.json files, and the hub ids
that name them, so that `--model meta-llama/Llama-3.2-1B` works offline (random weights) when the checkpoint is
not in the local cache. Fields that do not change the graph or the memory (bos/eos ids, initializer ranges)
are left at the library defaults. The `tiny-*` presets are the same architectures at toy size, for tests and
for CPU runs in seconds."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "polyglot-ko-1.3b": dict(
        model_type="gpt_neox", hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=8192, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "polyglot-ko-3.8b": dict(
        model_type="gpt_neox", hidden_size=3072, num_hidden_layers=32, num_attention_heads=24,
        intermediate_size=12288, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "polyglot-ko-5.8b": dict(
        model_type="gpt_neox", hidden_size=4096, num_hidden_layers=28, num_attention_heads=16,
        intermediate_size=16384, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "polyglot-ko-12.8b": dict(
        model_type="gpt_neox", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
        intermediate_size=20480, vocab_size=30080, max_position_embeddings=2048, rotary_pct=0.5,
        rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
        layer_norm_eps=1e-5, hidden_act="gelu", dtype="float16",
    ),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
        dtype="bfloat16",
    ),
    "llama-3.2-3b": dict(
        model_type="llama", hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
        dtype="bfloat16",
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
        dtype="bfloat16",
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
        dtype="bfloat16",
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
        dtype="bfloat16",
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu",
        dtype="bfloat16",
    ),
    "mistral-7b": dict(
        model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False,
        hidden_act="silu", dtype="bfloat16",
    ),
    "gpt2": dict(
        model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
        activation_function="gelu_new", tie_word_embeddings=True, dtype="float32",
    ),
    "gemma-2-2b": dict(
        model_type="gemma2", hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, dtype="float32",
    ),
    "phi-3-mini": dict(
        model_type="phi3", hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=8192, vocab_size=32064, max_position_embeddings=4096,
        original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=2047,
        tie_word_embeddings=False, hidden_act="silu", pad_token_id=32000, dtype="bfloat16",
    ),
    "olmo-2-1b": dict(
        model_type="olmo2", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=8192, vocab_size=100352, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False, hidden_act="silu",
        pad_token_id=100277, dtype="float32",
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        hidden_act="silu", dtype="bfloat16",
    ),
    "gemma-3-1b": dict(
        model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, dtype="bfloat16",
    ),
    "phi-2": dict(
        model_type="phi", hidden_size=2560, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=10240, vocab_size=51200, max_position_embeddings=2048,
        partial_rotary_factor=0.4, layer_norm_eps=1e-5, rope_theta=10000.0, qk_layernorm=False,
        resid_pdrop=0.1, embd_pdrop=0.0, attention_dropout=0.0, hidden_act="gelu_new",
        tie_word_embeddings=False, dtype="float16",
    ),
    "stablelm-2-1.6b": dict(
        model_type="stablelm", hidden_size=2048, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=5632, vocab_size=100352, max_position_embeddings=4096,
        partial_rotary_factor=0.25, layer_norm_eps=1e-5, rope_theta=10000.0, use_qkv_bias=True,
        qk_layernorm=False, use_parallel_residual=False, hidden_act="silu", tie_word_embeddings=False,
        dtype="float16",
    ),
    # Tiny presets: the same architectures at toy size, for tests and for CPU runs in seconds.
    "tiny-gpt-neox": dict(
        model_type="gpt_neox", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, vocab_size=1024, max_position_embeddings=512, rotary_pct=0.5,
        use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu", dtype="float32",
    ),
    "tiny-llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=176, vocab_size=1024, max_position_embeddings=512,
        tie_word_embeddings=False, hidden_act="silu", dtype="float32",
    ),
    "tiny-qwen2": dict(
        model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=176, vocab_size=1024, max_position_embeddings=512,
        tie_word_embeddings=True, hidden_act="silu", dtype="float32",
    ),
    "tiny-gpt2": dict(
        model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=1024, n_positions=512,
        tie_word_embeddings=True, dtype="float32",
    ),
}

# The seed's model id and the hub ids of the presets, so that `--model EleutherAI/polyglot-ko-1.3b`
# works offline (random weights) when the checkpoint is not in the local cache.
HUB_IDS: dict[str, str] = {
    "EleutherAI/polyglot-ko-1.3b": "polyglot-ko-1.3b",
    "EleutherAI/polyglot-ko-3.8b": "polyglot-ko-3.8b",
    "EleutherAI/polyglot-ko-5.8b": "polyglot-ko-5.8b",
    "EleutherAI/polyglot-ko-12.8b": "polyglot-ko-12.8b",
    "meta-llama/Llama-3.2-1B": "llama-3.2-1b",
    "meta-llama/Llama-3.2-3B": "llama-3.2-3b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "openai-community/gpt2": "gpt2",
    "google/gemma-2-2b": "gemma-2-2b",
    "microsoft/Phi-3-mini-4k-instruct": "phi-3-mini",
    "allenai/OLMo-2-0425-1B": "olmo-2-1b",
    "Qwen/Qwen3-0.6B": "qwen3-0.6b",
}


__all__ = ["PRESETS", "HUB_IDS"]
