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
    # meta-llama/Llama-3.1-70B: the sizes in oumi-ai/oumi configs/recipes/llama3_1/README.md ("70B": vocab 128,256,
    # hidden 8192, MLP 28,672, 80 layers, 64 heads, 8 KV heads, untied, 131,072 positions); the rope and norm fields
    # are the Llama 3.1 family's, as in llama-3.1-8b above
    "llama-3.1-70b": dict(
        model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256,
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
    # --- MoE models (issue 33 item 5). Each config was read from the sources named above it; fields that do not
    # change the graph or the memory (token ids, initializer ranges, use_cache, transformers_version) are left out.
    # mistralai/Mixtral-8x7B-v0.1: full config.json in inference-sim/inference-sim
    # model_configs/mixtral-8x7b-v0.1/config.json and mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py
    # ("Mixtral-8x7B-v0.1"); AI-Hypercomputer/maxtext src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py
    # quotes the Instruct twin's, field for field the same.
    "mixtral-8x7b": dict(
        model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2, output_router_logits=False,
        router_aux_loss_coef=0.02, vocab_size=32000, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1000000.0, sliding_window=None, attention_dropout=0.0, tie_word_embeddings=False,
        hidden_act="silu", dtype="bfloat16",
    ),
    # Qwen/Qwen3-30B-A3B: full config.json in inference-sim/inference-sim model_configs/qwen3-30b-a3b/config.json
    # and citsjtu2020/LLM-Prof sglang/Model_Config.md ("Qwen3-30B-A3B"); the two agree field for field.
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False,
        router_aux_loss_coef=0.001, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_scaling=None, attention_bias=False, attention_dropout=0.0,
        use_sliding_window=False, sliding_window=None, max_window_layers=48, tie_word_embeddings=False,
        hidden_act="silu", dtype="bfloat16",
    ),
    # allenai/OLMoE-1B-7B-0924: every size field below is quoted alike by several repositories' partial copies
    # (e.g. a moe_engine test fixture "The fields of allenai/OLMoE-1B-7B-0924's config.json that the adapter
    # reads"); one of them gives torch_dtype float32. Found by code search, no full copy. float32 is kept (issue 41
    # asked whether the hub checkpoint is bf16): transformers' own conversion script for OLMoE
    # (models/olmoe/convert_olmoe_weights_to_hf.py) reloads the converted weights with torch_dtype=torch.float32 and
    # saves them so; of two test fixtures that pair the published sizes with a dtype, one says float32, the other
    # bfloat16; the hub file itself was not reachable. `--precision auto` prices fp32 on CUDA.
    "olmoe-1b-7b": dict(
        model_type="olmoe", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
        intermediate_size=1024, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
        output_router_logits=False, router_aux_loss_coef=0.01, clip_qkv=None, vocab_size=50304,
        max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False,
        attention_dropout=0.0, tie_word_embeddings=False, hidden_act="silu", dtype="float32",
    ),
    # deepseek-ai/DeepSeek-V2-Lite: full config.json in inference-sim/inference-sim
    # model_configs/deepseek-v2-lite/config.json and AI-Hypercomputer/maxtext
    # src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py (deepseek2_16b_dict); mlc-ai/mlc-llm
    # python/mlc_llm/model/model_preset.py ("deepseek_v2_lite") agrees. q_lora_rank None: no query compression.
    "deepseek-v2-lite": dict(
        model_type="deepseek_v2", hidden_size=2048, num_hidden_layers=27, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, n_group=1, topk_group=1,
        topk_method="greedy", scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0,
        aux_loss_alpha=0.001, seq_aux=True, vocab_size=102400, max_position_embeddings=163840, rms_norm_eps=1e-6,
        rope_theta=10000, rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
                                            beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False, hidden_act="silu",
        dtype="bfloat16",
    ),
    # openai/gpt-oss-20b: full config.json in AI-Hypercomputer/maxtext
    # src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py (gpt_oss_20b_dict, quantization_config dropped)
    # and decoderesearch/circuit-tracer tests/test_attributions_gpt_oss_nnsight.py (gpt_oss_config, with it).
    # The checkpoint keeps its experts in MXFP4 (quantization_config, left out here) and the rest in bf16; the
    # file names no torch_dtype. trainmem trains it in bf16 (dequantized experts), hence dtype="bfloat16".
    # experts_per_token and initial_context_length repeat num_experts_per_tok and the yarn original length.
    "gpt-oss-20b": dict(
        model_type="gpt_oss", hidden_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
        head_dim=64, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4, output_router_logits=False,
        router_aux_loss_coef=0.9, swiglu_limit=7.0, vocab_size=201088, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=150000,
        rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                          original_max_position_embeddings=4096, truncate=False),
        sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12, attention_bias=True,
        attention_dropout=0.0, tie_word_embeddings=False, hidden_act="silu", dtype="bfloat16",
    ),
    # Qwen/Qwen1.5-MoE-A2.7B: mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py ("qwen2moe") quotes the full
    # config.json of the Chat twin (Qwen1.5-MoE-A2.7B-Chat, same architecture; the two files differ in token ids
    # only); the base's sizes are quoted (partly) in several test fixtures found by code search.
    "qwen1.5-moe-a2.7b": dict(
        model_type="qwen2_moe", hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
        decoder_sparse_step=1, output_router_logits=False, router_aux_loss_coef=0.001, vocab_size=151936,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
        sliding_window=32768, max_window_layers=21, attention_dropout=0.0, tie_word_embeddings=False,
        hidden_act="silu", dtype="bfloat16",
    ),
    # deepseek-ai/DeepSeek-V3: full config.json in AI-Hypercomputer/maxtext
    # src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py (deepseek3_671b_dict, its fp8
    # quantization_config dropped: the checkpoint stores fp8 blocks, trainmem trains in bf16). transformers builds
    # the 61 main layers only, not the multi-token-prediction layer (num_nextn_predict_layers).
    "deepseek-v3": dict(
        model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
        num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256,
        n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3, moe_layer_freq=1, n_group=8,
        topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
        routed_scaling_factor=2.5, num_nextn_predict_layers=1, vocab_size=129280, max_position_embeddings=163840,
        rms_norm_eps=1e-6, rope_theta=10000,
        rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
                          mscale=1.0, mscale_all_dim=1.0),
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False, hidden_act="silu",
        dtype="bfloat16",
    ),
    # --- Hybrids: short-convolution / state-space layers beside attention.
    # LiquidAI/LFM2-1.2B: full config.json in Cmerrill1713/neuroforge-ai-platform
    # mlx_models/lfm2-1.2b-mlx-official/config.json (an MLX copy whose architectures/model_type that repo relabels;
    # every other field as published), cross-checked with two test fixtures found by code search that quote it
    # (one verbatim). 16 layers: attention at full_attn_idxs, short convolutions elsewhere; the feed-forward width
    # is block_ff_dim adjusted (2/3, multiple of 256) to 8192. Embeddings tied (Lfm2Config default; the file names
    # no tie_word_embeddings).
    "lfm2-1.2b": dict(
        model_type="lfm2", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        block_ff_dim=12288, block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
        full_attn_idxs=[2, 5, 8, 10, 12, 14], conv_L_cache=3, conv_bias=False, vocab_size=65536,
        max_position_embeddings=128000, norm_eps=1e-5, rope_theta=1000000.0, dtype="bfloat16",
    ),
    # --- Dense families never measured before (validation set).
    # facebook/opt-1.3b: config.json quoted in erfanzar/EasyDeL EasyDel/configs/configs.py (opt_configs["1.3b"],
    # every field but torch_dtype); float16 storage as the hub file's torch_dtype says, cross-checked against a
    # weight-size table found by code search (2,631,516,160 bytes = 2 bytes x 1,315,758,080 parameters).
    "opt-1.3b": dict(
        model_type="opt", hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, ffn_dim=8192,
        word_embed_proj_dim=2048, do_layer_norm_before=True, vocab_size=50272, max_position_embeddings=2048,
        activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        dtype="float16",
    ),
    # bigscience/bloom-560m: full config.json quoted (as loaded) in a BLOOM notes file found by code search; sizes
    # also in transformers' BloomConfig docs. The file names no torch_dtype: the weights are stored in float16
    # (BLOOM: bf16 for the 176B model, fp16 for the smaller ones), so dtype="float16". ALiBi, no max positions.
    "bloom-560m": dict(
        model_type="bloom", hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880, layer_norm_epsilon=1e-5,
        apply_residual_connection_post_layernorm=False, attention_dropout=0.0, hidden_dropout=0.0,
        pretraining_tp=1, slow_but_exact=False, dtype="float16",
    ),
    # tiiuae/falcon-7b: erfanzar/EasyDeL EasyDel/configs/configs.py (falcon_configs["7b"], the pre-port field
    # names n_head/n_layer) and a vLLM profiling script found by code search that writes the hub config.json
    # (1 layer): multi-query attention, parallel attention/MLP, no ALiBi, no biases, bf16. The file names no
    # max_position_embeddings (FalconConfig's 2048, the trained length). Embeddings tied (FalconConfig default).
    "falcon-7b": dict(
        model_type="falcon", hidden_size=4544, num_hidden_layers=32, num_attention_heads=71, multi_query=True,
        new_decoder_architecture=False, parallel_attn=True, alibi=False, bias=False, vocab_size=65024,
        layer_norm_epsilon=1e-5, attention_dropout=0.0, hidden_dropout=0.0, dtype="bfloat16",
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
    "tiny-qwen3-moe": dict(
        model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=176, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=1024, max_position_embeddings=512,
        tie_word_embeddings=False, hidden_act="silu", dtype="float32",
    ),
    "tiny-olmoe": dict(
        model_type="olmoe", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, vocab_size=1024,
        max_position_embeddings=512, tie_word_embeddings=False, hidden_act="silu", eos_token_id=2,
        dtype="float32",
    ),
    "tiny-mixtral": dict(
        model_type="mixtral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, vocab_size=1024,
        max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False, hidden_act="silu",
        dtype="float32",
    ),
    # hybrids: one short-convolution layer then one attention layer (LFM2); one Mamba-2 layer then one attention
    # layer, both with 4 experts top-2 and a shared expert (Granite 4.0-H)
    "tiny-lfm2": dict(
        model_type="lfm2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=176, block_auto_adjust_ff_dim=False, layer_types=["conv", "full_attention"],
        conv_L_cache=3, conv_bias=False, vocab_size=1024, max_position_embeddings=512, dtype="float32",
    ),
    "tiny-granitemoehybrid": dict(
        model_type="granitemoehybrid", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=32, shared_intermediate_size=64, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=32,
        mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
        position_embedding_type="nope", vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=True,
        dtype="float32",
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
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "openai-community/gpt2": "gpt2",
    "google/gemma-2-2b": "gemma-2-2b",
    "microsoft/Phi-3-mini-4k-instruct": "phi-3-mini",
    "allenai/OLMo-2-0425-1B": "olmo-2-1b",
    "Qwen/Qwen3-0.6B": "qwen3-0.6b",
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
}


__all__ = ["PRESETS", "HUB_IDS"]
