"""Every causal-LM model type of the installed transformers, tried as a new user would: a tiny config of
each (built from its config class, every size field shrunk), trained one step by plain transformers, then
estimated (`simulate`, `analytic`), run on the CPU and compared state by state with trainmem.

    >>> from lab import registry
    >>> cfg = registry.tiny_config("llama")
    >>> cfg.hidden_size, cfg.num_hidden_layers
    (64, 2)
    >>> registry.check("llama")["states_exact"]
    True

The model types are `transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (178 in
transformers 5.17). A tiny config is the config class's defaults with every size field (by name: hidden
widths, layer, head and expert counts, FFN widths, vocabulary, positions, state sizes) set to a toy value
(`SIZES`), sub-configs (vision towers, `text_config`) shrunk the same way, and per-layer lists (`layer_types`,
`mlp_layer_types`, ...) cut to one layer of each kind the full model has, so that a hybrid keeps an attention
layer and a state-space one and an MoE keeps a dense and a sparse layer. `OVERRIDES` holds the few fields no
name rule can know (layer periods, byte-group sizes). `benchmarks/registry.py` runs `check` over every type
and writes `docs/models.md`; `tests/slow/test_registry.py` checks every type plain transformers trains.

Known limitations: the tiny config is random-weight toy sizes only; what depends on real sizes (kernel
choices, the allocator's rounding on a GPU) is not exercised here, only that each door runs and that the
model states agree to the byte. A type plain transformers cannot train (a config class with no default, a
model that needs inputs beyond token ids, a kernel package that is not installed) is recorded with the
reason and not tried further. Encoders whose LM head is a decoder only with `is_decoder` (BERT-likes) get
it set, as trainmem's refusal of them tells a user to.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
import traceback
from typing import Any

SIZES: dict[str, int] = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, expert_ffn=32,
                             vocab=1024, positions=128, experts=4, top_k=2, state=16, window=16, rank=32,
                             groups=1, rotary=8, shared_experts=1, dense_first=1)
"""The toy sizes: hidden 64 = 4 heads x 16, 2 layers (more where one layer of each kind needs them), a
1024-token vocabulary, 128 positions (a batch of 2 x 32 tokens fits), 4 experts with top-2 routing."""

BATCH, SEQ = 2, 32
"""The micro-batch every door trains: 2 samples of 32 tokens."""

LORA_RANK = 4
"""The LoRA door's rank: no more than the narrowest layer a toy model's default targets hold (a layer as wide
as its 4 heads, such as a sparse-attention indexer's `weights_proj`), which trainmem refuses to exceed."""

VARIANTS: dict[str, dict[str, Any]] = {
    "lora_all_linear": dict(peft="lora", lora_targets=["all-linear"], lora_r=LORA_RANK),
    "qlora": dict(peft="qlora", lora_r=LORA_RANK),
}
"""The adapter setups every type is estimated under besides the default LoRA door (issue 41): LoRA on every
Linear layer (`--lora-targets all-linear`) and QLoRA with the default targets, the estimate only (a 4-bit
run needs bitsandbytes and a GPU). Each either simulates, or is refused at the door in one line naming a flag
(`variant`)."""

# field name -> SIZES key; a field is shrunk only when its default is larger than the toy size
_RULES: list[tuple[str, str]] = [
    (r"(hidden_size|n_embd|d_model|dim|embed_dim|emb_dim|embedding_dim|model_dim|hidden_dim|word_embed_proj_dim"
     r"|attention_hidden_size|lru_width|backbone_hidden_size|embedding_size|input_embedding_size"
     r"|output_embedding_size|hidden_size_per_layer_input|d_embed|n_embed|dim_model|projection_dim"
     r"|mamba_d_ssm|encoder_hidden_size|text_hidden_size|router_hidden_size|ple_embed_dim|hidden_size_global)",
     "hidden"),
    (r"(num_hidden_layers|n_layer|num_layers|n_layers|decoder_layers|encoder_layers|num_decoder_layers"
     r"|num_encoder_layers|num_blocks|num_layers_per_stack|n_layers_per_stack)", "layers"),
    (r"(num_attention_heads|n_head|n_heads|num_heads|decoder_attention_heads|encoder_attention_heads"
     r"|attention_heads|num_decoder_attention_heads|num_encoder_attention_heads|swa_num_attention_heads"
     r"|linear_num_heads|linear_num_key_heads|linear_num_value_heads|mamba_n_heads|mamba_num_heads"
     r"|index_n_heads|num_v_heads|num_k_heads|n_kv_heads_linear)", "heads"),
    (r"(num_key_value_heads|num_kv_heads|swa_num_key_value_heads|num_query_groups|n_kv_heads|multi_query_group_num)",
     "kv_heads"),
    (r"(head_dim|\w+_head_dim|d_head|dim_head|kv_channels|attention_head_dim|attention_head_size|mamba_d_head"
     r"|mamba_headdim|mamba_head_dim|d_kv|index_head_dim|d_rel|qk_nope_head_dim|v_head_dim)", "head_dim"),
    (r"(intermediate_size|n_inner|ffn_dim|decoder_ffn_dim|encoder_ffn_dim|dim_ff|dff|d_inner|ffn_hidden_size"
     r"|feed_forward_size|intermediate_size_mlp|dense_intermediate_size|d_ff|ffn_inner_size|mlp_dim)", "ffn"),
    (r"(moe_intermediate_size|shared_expert_intermediate_size|moe_shared_expert_intermediate_size"
     r"|shared_intermediate_size|expert_ffn_hidden_size|expert_intermediate_size|moe_ffn_hidden_size)", "expert_ffn"),
    (r"(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|moe_num_routed_experts)",
     "experts"),
    (r"(num_experts_per_tok|moe_top_k|moe_topk|top_k|num_experts_per_token|moe_k)", "top_k"),
    (r"(vocab_size|decoder_vocab_size|vocab_size_per_layer_input|shape_vocab_size|pronunciation_vocab_size)", "vocab"),
    (r"(max_position_embeddings|n_positions|n_ctx|max_seq_len|max_target_positions|context_length"
     r"|model_max_length|max_source_positions|seq_length|max_sequence_length)", "positions"),
    (r"(sliding_window|window_size|attention_window_size|sliding_window_size|local_attention|attention_chunk_size"
     r"|local_attn_chunk_length|lsh_attn_chunk_length|keep_window_size)", "window"),
    (r"(state_size|mamba_d_state|ssm_state_size|d_state|time_step_rank|mamba_dt_rank|chunk_size|mamba_chunk_size)",
     "state"),
    (r"(n_shared_experts|num_shared_experts)", "shared_experts"),
    (r"(first_k_dense_replace|moe_layer_start_index|first_k_dense)", "dense_first"),
    (r"(n_group|topk_group|num_expert_group|topk_groups|n_groups|mamba_n_groups)", "groups"),
    (r"(rotary_dim|rotary_emb_dim)", "rotary"),
    (r"(kv_lora_rank|q_lora_rank|o_lora_rank|adapter_rank|laurel_rank|hc_lowrank|gated_norm_rank|rope_dim"
     r"|qk_rope_head_dim)", "rank"),
]
_RULE = [(re.compile(rf"^{pattern}$"), key) for pattern, key in _RULES]


def _target(name: str) -> str | None:
    for pattern, key in _RULE:
        if pattern.match(name):
            return key
    return None


_FILL = ("head_dim", "kv_heads", "top_k", "experts", "groups", "shared_experts")
"""Sizes a model needs that some config classes leave None by default (DeepSeek-V2's top-k, Dots1's
experts, HunYuan's head size): a user's config.json sets them, so the tiny config does too."""


def _shrink_value(name: str, value: Any, default_heads: dict[str, Any]) -> Any:
    """The toy value of one config field, or `value` itself where no rule applies or it is already small."""
    key = _target(name)
    if key is not None and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [_shrink_value(name, v, default_heads) for v in value]
    if key is None or isinstance(value, bool) or not isinstance(value, (int, type(None))):
        return value
    if value is None:
        fill = key in _FILL and not name.startswith(("q_", "o_", "index"))
        return (SIZES["heads"] if key == "kv_heads" else SIZES[key]) if fill else None
    size = SIZES[key]
    if key == "kv_heads":
        # multi-head attention stays multi-head; grouped (or multi-query) attention keeps fewer KV heads
        heads = default_heads.get("heads")
        if heads is not None and value >= heads:
            size = SIZES["heads"]
        elif value == 1:
            size = 1
    return min(value, size) if value > 0 else value


def _shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """Every size field of one config's dict (sub-config dicts and rope dicts included) at toy size."""
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "num_heads", "n_heads") if isinstance(d.get(k), int)),
                 None)
    out: dict[str, Any] = {}
    for name, value in d.items():
        if isinstance(value, dict) and name not in ("id2label", "label2id"):
            out[name] = _shrink_dict(value)
        else:
            out[name] = _shrink_value(name, value, {"heads": heads})
    vocab = out.get("vocab_size")
    if isinstance(vocab, int):
        out.update(_token_ids(out, vocab))
    return out


def _token_ids(d: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Special token ids past the shrunk vocabulary, moved to its top (distinct ids, above the ids the dummy
    data draws, so that random text never holds an image or audio placeholder)."""
    out: dict[str, Any] = {}
    top = vocab - 1
    for name, value in sorted(d.items()):
        if not (name.endswith("_token_id") or name.endswith("_token_index") or name.endswith("_token_ids")):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
            out[name], top = top, top - 1
        elif isinstance(value, list) and any(isinstance(v, int) and v >= vocab for v in value):
            moved = []
            for v in value:
                if isinstance(v, int) and v >= vocab:
                    moved.append(top)
                    top -= 1
                else:
                    moved.append(v)
            out[name] = moved
    return out


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "num_decoder_layers",
                 "num_blocks")
_NOT_PER_LAYER = ("architectures", "ssm_multipliers", "encoder_hash_byte_group_size", "bad_words_ids")


def _layer_lists(d: dict[str, Any], layers: int) -> tuple[list[str], list[str]]:
    """(per-layer lists: one entry per layer; index lists: the indices of the layers that are something)."""
    per_layer, index = [], []
    for name, value in d.items():
        if not isinstance(value, (list, tuple)) or name in _NOT_PER_LAYER or not value:
            continue
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if ints and list(value) == sorted(set(value)) and max(value) < layers and (len(value) > 1 or layers > 1):
            index.append(name)  # layer indices (all of them is an index list too, not one kind per layer)
        elif len(value) == layers:
            per_layer.append(name)
    return per_layer, index


def _cut_layers(full: dict[str, Any], tiny: dict[str, Any]) -> dict[str, Any]:
    """`tiny` with its layer count and per-layer lists cut to one layer of each kind the full config has (at
    least `SIZES["layers"]`), in the full model's order: a hybrid keeps an attention and a recurrent layer,
    an MoE a dense and a sparse one. Nested configs (`text_config`) are cut the same way."""
    out = dict(tiny)
    for name, value in full.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = _cut_layers(value, out[name])
    key = next((k for k in _LAYER_COUNTS if isinstance(full.get(k), int) and not isinstance(full.get(k), bool)), None)
    if key is None:
        return out
    layers = full[key]
    per_layer, index = _layer_lists(full, layers)
    if not per_layer and not index:
        return out
    kinds = [tuple(json.dumps(full[n][i], sort_keys=True) for n in per_layer)
             + tuple(i in full[n] for n in index) for i in range(layers)]
    chosen: list[int] = []
    for i, kind in enumerate(kinds):
        if kind not in (kinds[j] for j in chosen):
            chosen.append(i)
    for i in range(layers):  # at least the toy layer count
        if len(chosen) >= min(SIZES["layers"], layers):
            break
        if i not in chosen:
            chosen.append(i)
    chosen.sort()
    out[key] = len(chosen)
    for n in per_layer:  # the shrunk values where the list holds sizes (Gemma-3n's per-layer FFN widths)
        source = out[n] if isinstance(out.get(n), list) and len(out[n]) == layers else full[n]
        out[n] = [source[i] for i in chosen]
    for n in index:
        out[n] = [j for j, i in enumerate(chosen) if i in full[n]]
    return out


def _consistent(d: dict[str, Any]) -> dict[str, Any]:
    """Sizes that must agree with others after shrinking: a Mamba head count times its head size is the
    expanded width; DeepSeek's query-key head is its no-rope part plus its rope part."""
    out = dict(d)
    for name, value in d.items():
        if isinstance(value, dict):
            out[name] = _consistent(value)
    hidden = out.get("hidden_size")
    expand = next((out[k] for k in ("mamba_expand", "expand") if isinstance(out.get(k), (int, float))), None)
    heads = next((k for k in ("mamba_n_heads", "mamba_num_heads", "n_mamba_heads") if isinstance(out.get(k), int)),
                 None)
    head = next((k for k in ("mamba_d_head", "mamba_head_dim", "mamba_headdim") if isinstance(out.get(k), int)), None)
    if heads is None and head is None and "state_size" in out and "num_heads" in out and "head_dim" in out:
        heads, head = "num_heads", "head_dim"  # Mamba-2's own names
    if isinstance(hidden, int) and expand and heads and head:
        inner = out["mamba_d_ssm"] if isinstance(out.get("mamba_d_ssm"), int) else int(expand * hidden)
        out[head] = inner // out[heads]
    if (isinstance(out.get("qk_nope_head_dim"), int) and isinstance(out.get("qk_rope_head_dim"), int)
            and "qk_head_dim" in out):
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    return out


_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
OVERRIDES: dict[str, dict[str, Any]] = {
    # hybrids whose layer kinds come from a period, an index list or a pattern rather than a per-layer list
    "bamba": dict(attn_layer_indices=[1]),  # its default (None) is all Mamba: Bamba-9B puts attention at 9, 18, 27
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"]),  # its default is all Mamba
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),  # no default layer_types
    "lfm2": dict(layer_types=["conv", "full_attention"]),  # its default is all attention (LFM2-1.2B: 10 conv, 6)
    "longcat_flash": dict(zero_expert_num=4),  # identity experts beside the routed ones (256 by default)
    "zamba": dict(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid", "hybrid"]),  # shared
    # block tied across hybrid layers: two of them
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "reformer": dict(is_decoder=True, attn_layers=["local", "lsh"], axial_pos_shape=[4, 8],
                     axial_pos_embds_dim=[32, 32], local_attn_chunk_length=16, lsh_attn_chunk_length=16),
    # QSA indexer fields: None by default, and the only attention Qwen4-Exp has
    "qwen4_exp_text": dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16,
                           indexer_compress_ratio=4),
    # rope parameters per layer type (the default is empty, which the model cannot read)
    # (its 3-D rotary sections default to a 128-wide head: [22, 22, 20] pairs)
    "cohere_compass_text": dict(rope_parameters={t: {**_ROPE, "mrope_section": [3, 3, 2]}
                                                 for t in ("full_attention", "sliding_attention")}),
    "gemma3n_text": dict(num_kv_shared_layers=2),  # the last layers reuse the KV of the earlier ones of their kind
    "blt": dict(encoder_hash_byte_group_vocab=1024, encoder_hash_byte_group_size=[3, 4]),  # hashed n-gram tables
}
OVERRIDES["qwen4_exp"] = dict(text_config={"model_type": "qwen4_exp_text", **OVERRIDES["qwen4_exp_text"]})
"""Per model type, fields no name rule can set (applied last, to the top-level config; a sub-config's
fields merge into the shrunk ones)."""


def _field_defaults(cls: type) -> dict[str, Any]:
    """A config class's fields and their class defaults (dataclass configs; else its __init__ signature)."""
    import inspect

    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            out[f.name] = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        return out
    return {n: (p.default if p.default is not inspect.Parameter.empty else None)
            for n, p in inspect.signature(cls.__init__).parameters.items() if n not in ("self", "kwargs")}


def _changed(cls: type, full: dict[str, Any], tiny: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments that turn `cls`'s defaults into `tiny`: the fields that changed, where the class
    sets them (a field derived in `__post_init__` from others, default None, is left to be derived again
    from the shrunk ones), and the fields a default leaves None that the model needs (`_FILL`)."""
    defaults = _field_defaults(cls)
    # a field stored under another name (Qwen3-MoE's num_experts is saved as num_local_experts)
    aliases = {stored: field for field, stored in (getattr(cls, "attribute_map", {}) or {}).items()}
    subs = getattr(cls, "sub_configs", {}) or {}
    out: dict[str, Any] = {}
    for name, value in tiny.items():
        old = full.get(name)
        if name not in defaults and aliases.get(name) in defaults:
            if value != old:
                out[aliases[name]] = value
            continue
        if isinstance(value, dict) and isinstance(old, dict) and name in subs:
            sub = subs[name]
            if "model_type" in old and not dataclasses.is_dataclass(sub):  # AutoConfig: the type names the class
                from transformers import CONFIG_MAPPING

                sub = CONFIG_MAPPING[old["model_type"]]
            nested = _changed(sub, old, value)
            if "model_type" in old:
                nested["model_type"] = old["model_type"]
            out[name] = nested
        elif value != old and name in defaults and (defaults[name] is not None or old is None
                                                  or isinstance(value, list)):
            out[name] = value
    return out


def tiny_config(model_type: str) -> Any:
    """The tiny config of `model_type`: its config class's defaults at toy size (see the module docstring)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    full = cls().to_dict()
    tiny = _consistent(_cut_layers(full, _shrink_dict(full)))
    kwargs = _changed(cls, full, tiny)
    for name, value in OVERRIDES.get(model_type, {}).items():
        if isinstance(value, dict) and isinstance(kwargs.get(name), dict) and "model_type" in value:
            kwargs[name] = {**kwargs[name], **value}
        else:
            kwargs[name] = value
    if _encoder_as_decoder(cls):  # as trainmem's refusal tells a user to (BERT-likes: "is_decoder": true)
        kwargs["is_decoder"] = True
    return cls(**kwargs)


def _encoder_as_decoder(config_class: type) -> bool:
    """Whether the causal-LM class of `config_class` is an encoder's LM head that is a decoder only with
    `is_decoder` set (BertLMHeadModel and its kin), which `ModelSpec.from_config_file` requires."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from trainmem.config.specs import _needs_is_decoder

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[config_class]
    except (KeyError, ValueError):
        return False
    return _needs_is_decoder(model_class)


# --- the doors, one model type at a time ---------------------------------------------------------------

_RECURRENT = re.compile(r"Mamba|Mixer|SSM|Ssm|DeltaNet|DeltaRule|LinearAttention|Lightning|ShortConv|Recurrent"
                        r"|Rglru|RGLRU|Rwkv|RWKV|LSTM|Lstm|Xlstm|Conv1dBlock|Retention|Hyena|KimiDelta")
_ATTENTION = re.compile(r"Attention|SelfAttn|Attn$|Attn[A-Z]|MLA$")
_LINEAR_ATTENTION = re.compile(r"LinearAttention|Lightning|DeltaNet|DeltaRule|KimiDelta|Retention")
_MOE = re.compile(r"Moe|MoE|Expert|SparseMlp|SparseMLP|Router")


def kind(model: Any) -> str:
    """`dense`, `MoE`, `hybrid` (state-space or linear-attention layers beside attention), `hybrid MoE`, or
    `recurrent` (state-space / RNN layers and no attention), read off the model's module classes."""
    names = [type(m).__name__ for m in model.modules()]
    qualified = [n for n, _ in model.named_modules()]
    recurrent = any(_RECURRENT.search(n) for n in names)
    attention = any(_ATTENTION.search(n) and not _LINEAR_ATTENTION.search(n) for n in names)
    moe = any(_MOE.search(n) for n in names) or any(n.endswith(".experts") for n in qualified)
    base = "hybrid" if recurrent and attention else "recurrent" if recurrent else "dense"
    if moe:
        return "MoE" if base == "dense" else f"{base} MoE"
    return base


_FRAMES = ("trainmem/", "transformers/", "peft/")
# frames that only pass a call on: the ledger's dispatch, transformers' config attribute lookup
_PASSING = ("__torch_dispatch__", "__getattribute__", "__getattr__", "_wrapped_call_impl", "_call_impl", "wrapper",
            "decorate_context")


def _frame(path: str, line: int | str, name: str) -> str:
    for k in _FRAMES:
        if k in path:
            return f"{path[path.rindex(k):]}:{line} {name}"
    return f"{path}:{line} {name}"


def _innermost(frames: list[tuple[str, int | str, str]]) -> str:
    """The innermost frame in trainmem and the innermost in transformers/peft (wrappers that only pass a
    call on skipped), innermost last: where the failing call was made, and what in trainmem made it."""
    picked = []
    for package in (("trainmem/",), ("transformers/", "peft/")):
        mine = [f for f in frames if any(k in f[0] for k in package) and f[2] not in _PASSING
                and "heterogeneity" not in f[0]]
        if mine:
            picked.append((frames.index(mine[-1]), _frame(*mine[-1])))
    if not picked and frames:
        picked.append((len(frames) - 1, _frame(*frames[-1])))
    return " < ".join(f for _, f in sorted(picked, reverse=True))


def one_line(exc: BaseException) -> str:
    """Exception type, message (first 300 characters, one line) and where: the innermost frame in
    transformers/peft and in trainmem (`_innermost`): what a row of the table can say about a failure."""
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message[:300]} @ {_innermost(frames)}"


def _error_line(text: str) -> str:
    """One line from a run row's traceback text, as `one_line` makes it from an exception."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    frames = []
    for line in lines:
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', line)
        if m:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
    last = " ".join(lines[-1].split())[:300] if lines else text
    return f"{last} @ {_innermost(frames)}" if frames else last


def family(model_type: str) -> str:
    """The transformers model folder the type's config class lives in (`gpt2` for gpt-sw3)."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type].__module__.split(".")[2]


def plain_step(config: Any) -> Any:
    """Build the model with plain transformers on the CPU and train one step (forward with labels, backward,
    AdamW), in training mode with the KV cache off as a fine-tuning run has it; returns the model."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if count > 50_000_000:
        raise ValueError(f"the tiny config still has {count:,} parameters: a size field no rule shrinks")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.config.use_cache = False
    model.train()
    ids = dummy_ids(config)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=1e-4).step()
    return model


def dummy_ids(config: Any) -> Any:
    """A (BATCH, SEQ) batch of token ids below 900 (special ids were moved above it, `_token_ids`)."""
    import torch

    vocab = config.get_text_config(decoder=True).vocab_size
    return torch.randint(0, min(vocab, 900), (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def spec_of(model_type: str, config: Any) -> Any:
    """The ModelSpec a user gets from this config's `config.json` (written by `save_pretrained`, read by
    `ModelSpec.from_config_file`): the path `trainmem estimate --model config.json` takes."""
    from trainmem.config.specs import ModelSpec

    with tempfile.TemporaryDirectory(prefix="trainmem-registry-") as tmp:
        config.save_pretrained(tmp)
        spec = ModelSpec.from_config_file(os.path.join(tmp, "config.json"))
    return ModelSpec(name=model_type, config=spec.config, source="config")


def variant(spec: Any, setup: Any, name: str) -> Any:
    """The simulated estimate of `setup` under the adapter setup `VARIANTS[name]`; raises SetupError where
    trainmem refuses it at the door."""
    from trainmem.estimator import estimate

    return estimate(spec, setup.replace(**VARIANTS[name]), "simulate")


def variant_status(spec: Any, setup: Any, name: str) -> str:
    """One row's cell for `VARIANTS[name]`: `ok` (simulated), `refused: <its problem lines, joined by ; >`,
    `fallback to analytic: <its note>`, or the failure in one line (`one_line`)."""
    from trainmem.errors import SetupError

    try:
        b = variant(spec, setup, name)
    except SetupError as e:
        return "refused: " + "; ".join(e.problems)
    except Exception as e:  # every failure is a finding, recorded in one line
        return one_line(e)
    if b.method != "simulate":
        return f"fallback to {b.method}: " + next((n for n in b.notes if "simulate" in n), "")
    return "ok"


def check(model_type: str, methods: tuple[str, ...] = ("simulate", "analytic"), run: bool = True,
          lora: bool = True, variants: bool = True) -> dict[str, Any]:
    """One row: the type tried through every door. Each door's failure is caught and recorded in one line
    (`one_line`); a door that works records `ok`, an estimate that answered with the other method records
    `fallback to <method>: <its note>`. `states_exact`: the measured model states (weights, gradients,
    optimizer after the first step) equal the estimate's to the byte. `variants`: a cell per `VARIANTS` entry
    (`variant_status`)."""
    import torch

    from trainmem.config.setup import TrainSetup
    from trainmem.estimator import estimate
    from trainmem.isolation.runner import run as run_setup

    start = time.perf_counter()
    from transformers import CONFIG_MAPPING

    row: dict[str, Any] = {"type": model_type, "config_class": CONFIG_MAPPING[model_type].__name__,
                           "family": family(model_type), "kind": None, "parameters": None,
                           "trains_plain": False, "plain_error": None}
    timings: dict[str, float] = {}

    def timed(door: str, fn: Any) -> tuple[Any, str]:
        t0 = time.perf_counter()
        try:
            return fn(), "ok"
        except Exception as e:  # every failure is a finding, recorded in one line
            return None, one_line(e)
        finally:
            timings[door] = round(time.perf_counter() - t0, 2)

    config, status = timed("config", lambda: tiny_config(model_type))
    if config is None:
        row["plain_error"] = f"tiny config: {status}"
        return _finish(row, timings, start)
    model, status = timed("plain", lambda: plain_step(config))
    if model is None:
        row["plain_error"] = status
        return _finish(row, timings, start)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_defaults

    row.update(trains_plain=True, kind=kind(model), parameters=sum(p.numel() for p in model.parameters()),
               lora_peft_default=peft_defaults.get(model.config.model_type))
    del model
    spec, status = timed("spec", lambda: spec_of(model_type, config))
    if spec is None:
        row["estimate_simulate"] = row["estimate_analytic"] = row["run_cpu"] = f"config.json: {status}"
        return _finish(row, timings, start)
    setup = TrainSetup(batch_size=BATCH, seq_len=SEQ, device="cpu", precision="fp32")
    states: dict[str, dict[str, int]] = {}
    for method in methods:
        b, status = timed(method, lambda m=method: estimate(spec, setup, m))
        if b is not None:
            states[method] = dict(b.model_states)
            notes = [n for n in b.notes if any(w in n for w in ("analytic", "simulate", "routing"))]
            row[f"notes_{method}"] = notes
            if b.method != method:  # the estimate answered with the other method (its note says why)
                status = f"fallback to {b.method}: " + next((n for n in notes if method in n), "")
        row[f"estimate_{method}"] = status
    if run:
        result, status = timed("run", lambda: run_setup(spec, setup.replace(steps=2), isolate=False))
        if result is not None and result.status != "ok":
            status = f"status {result.status}: " + _error_line(result.error or json.dumps(result.oom))
        row["run_cpu"] = status
        if result is not None and result.status == "ok":
            measured = dict(result.model_states)
            row["measured_states"] = measured
            row["estimated_states"] = next(iter(states.values()), None)
            row["states_exact"] = all(s == measured for s in states.values()) if states else None
    if lora:
        b, status = timed("lora", lambda: estimate(spec, setup.replace(peft="lora", lora_r=LORA_RANK), "simulate"))
        row["lora"] = status
        # the targets adapted: peft's default (None) or trainmem's pick (`config.setup.default_lora_targets`)
        row["lora_targets"] = b.setup.get("lora_targets") if b is not None else None
    for name in VARIANTS if variants else ():
        t0 = time.perf_counter()
        row[name] = variant_status(spec, setup, name)
        timings[name] = round(time.perf_counter() - t0, 2)
    torch.set_grad_enabled(True)
    return _finish(row, timings, start)


def _finish(row: dict[str, Any], timings: dict[str, float], start: float) -> dict[str, Any]:
    row["seconds"] = round(time.perf_counter() - start, 2)
    row["timings"] = timings
    return row


def model_types() -> list[str]:
    """The causal-LM model types of the installed transformers, in its mapping's order."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
