"""The analytic method: closed-form activation and transient terms, with per-layer coefficients derived
from the model's own module structure (norm kind, MLP kind, fused or separate QKV, KV heads, dropout).

Notation: T = b*s tokens, h hidden, h_kv key/value width, i FFN width, a heads, V vocabulary, e bytes of
an activation (2 under fp16/bf16/autocast, 4 in fp32). "Saved" means kept from forward to backward.
The counting follows Korthikanti et al. 2022 (arXiv 2205.05198), redone for the Hugging Face modules as
written (the paper's 34*s*b*h assumes Megatron's fused layers; HF's RMSNorm keeps an fp32 copy, SwiGLU
keeps four i-wide tensors, GPT-NeoX keeps its fused QKV buffer alive through the attention).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from trainmem.hardware import cuda

from . import runtime


@dataclass(frozen=True)
class Traits:
    """What the activation formulas need to know about one decoder layer, read off the modules."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_width: int
    vocab: int
    norm: str
    """`rms` (Hugging Face RMSNorm: fp32 upcast inside) or `layer` (LayerNorm)."""
    gated_mlp: bool
    """SwiGLU-style gate/up/down MLP (Llama, Qwen2, Mistral) vs fc_in -> GELU -> fc_out."""
    fused_qkv: bool
    rotary: bool
    parallel_residual: bool
    dropout: float
    """Largest residual/attention dropout probability in the config (masks cost 1 byte per element)."""
    experts: int = 0
    """Experts of a mixture-of-experts layer (0: dense), whose weights are fused 3-D tensors."""
    top_k: int = 0
    """Experts each token runs."""
    expert_ffn: int = 0
    """One expert's FFN width."""
    shared_ffn: int = 0
    """The FFN width of the layer's shared (always-on) experts, together."""

    @classmethod
    def of(cls, model: Any) -> Traits:
        """The traits of `model`'s first decoder layer; a ValueError where its config or modules lack what the
        formulas need (no attention heads: RWKV, xLSTM; a size that varies per layer: Gemma-4's head_dim, which
        transformers refuses to read globally with a RuntimeError), which makes `estimate` simulate instead.
        Read once per model (`_KNOWN`): the every-card table estimates one inspected model once per card, and
        walking an 8B's modules costs tens of milliseconds each time."""
        known = _KNOWN.get(model)
        if known is None:
            known = _KNOWN[model] = cls._read(model)
        if isinstance(known, ValueError):
            raise ValueError(*known.args)
        return known

    @classmethod
    def _read(cls, model: Any) -> Traits | ValueError:
        if any(type(m).__name__ == "ParamWrapper" for m in model.modules()):
            return ValueError("LoRA on fused expert weights (peft's ParamWrapper) has no closed form here")
        try:
            return cls._of(model)
        except (AttributeError, TypeError, RuntimeError) as e:
            return ValueError(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")

    @classmethod
    def _of(cls, model: Any) -> Traits:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config.get_text_config(decoder=True)  # a composite config's language model
        layer = _first_layer(base)
        if any(isinstance(m, torch.nn.Conv1d) for m in base.modules()):
            raise ValueError("state-space or convolution layers beside attention (a hybrid), which the "
                             "closed form has no terms for")
        linears = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear) and "lora_" not in n}
        names = " ".join(linears)
        h = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
        heads = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or h // heads)
        gpt2_conv = not linears  # GPT-2 uses Conv1D, not Linear
        ffn = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * h)
        dropout = max(float(getattr(cfg, k, 0.0) or 0.0) for k in
                      ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop"))
        return cls(
            layers=int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer), hidden=h,
            ffn=ffn, heads=heads, kv_width=kv * head_dim,
            vocab=int(cfg.vocab_size),
            norm="rms" if any("RMSNorm" in type(m).__name__ for m in layer.modules()) else "layer",
            gated_mlp="gate_proj" in names or "w1" in names,
            fused_qkv=gpt2_conv or "query_key_value" in names or "qkv" in names,
            rotary=hasattr(base.model if hasattr(base, "model") else base, "rotary_emb")
            or any("rotary" in n for n, _ in base.named_modules()),
            parallel_residual=bool(getattr(cfg, "use_parallel_residual", False)),
            dropout=dropout, **_moe(base, cfg, h))


_KNOWN: weakref.WeakKeyDictionary[Any, Traits | ValueError] = weakref.WeakKeyDictionary()
"""`Traits.of` by model: what each inspected model's traits are, or why it has none."""


def _moe(base: Any, cfg: Any, hidden: int) -> dict[str, int]:
    """A mixture of experts' shape, from the first module holding fused 3-D expert weights (transformers 5's
    experts: `gate_up_proj` or `up_proj`, and `down_proj`) and the shared experts' Linears beside it."""
    from .states import experts_per_token

    for name, module in base.named_modules():
        weights = [p for p in module.parameters(recurse=False) if p.dim() == 3]
        if not weights:
            continue
        experts = weights[0].shape[0]
        down = getattr(module, "down_proj", None)
        width = (down.numel() if isinstance(down, torch.Tensor) else weights[-1].numel()) // (experts * hidden)
        k = experts_per_token(cfg) or experts
        layer = name.rsplit(".", 2)[0]
        shared = sum(m.out_features for n, m in base.named_modules()
                     if n.startswith(layer + ".") and "shared" in n and isinstance(m, torch.nn.Linear)
                     and n.rsplit(".", 1)[-1] in ("up_proj", "w3", "c_fc", "fc1"))
        return {"experts": experts, "top_k": min(k, experts), "expert_ffn": width, "shared_ffn": shared}
    return {}


def _first_layer(model: Any) -> torch.nn.Module:
    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            return mod[0]
    raise ValueError("no decoder layer list found")


def layer_saved(t: Traits, tokens: int, seq: int, e: int, r: int, eager: bool, lora_in: int = 0,
                frozen: bool = False, flash: bool = True) -> int:
    """Bytes one decoder layer saves for backward (flash/memory-efficient SDPA unless `eager`).

    `e`: bytes of matmul outputs; `r`: bytes of the residual stream and norms (4 under autocast over fp32
    weights and under QLoRA, where the norms run in fp32); `lora_in`: input features of the layer's
    LoRA-adapted Linears; `frozen`: the base weights take no gradient (LoRA/QLoRA), so a frozen Linear or
    norm weight needs no saved input: only what gradients flowing to earlier adapters pass through.
    `flash`: the card has the flash kernel (`hardware.cuda.sdpa_kernel` picks the kernel: flash or the
    memory-efficient one save the same tensors; the math path, where neither takes grouped KV heads, keeps
    the attention matrix).
    """
    h, hkv, i, T = t.hidden, t.kv_width, t.ffn, tokens
    if t.norm == "rms":
        # fp32 copy of the input (4), the normalized tensor (r), the weighted output the Linear saves (e);
        # with frozen weights only the fp32 input and its rsqrt are needed
        norms = 2 * ((4 if frozen else 4 + r + e) * h * T + 4 * T)
    elif t.parallel_residual:
        norms = ((r if frozen else r + 2 * e) * h * T + 2 * 8 * T)  # one shared input, two outputs
    else:
        norms = 2 * ((r if frozen else r + e) * h * T + 8 * T)  # each LayerNorm's input (and output)
    if t.fused_qkv:
        # the fused QKV output stays alive (V is a view of it) + rotated Q and K copies
        qkv = e * (h + 2 * hkv) * T + (e * (h + hkv) * T if t.rotary else 0)
    else:
        qkv = e * (h + 2 * hkv) * T  # rotated Q, K and V, saved by SDPA
    attn_out = (1 if frozen else 2) * e * h * T  # SDPA output (+ its copy saved by a trainable o_proj)
    # the math path keeps the attention matrix and K, V expanded to all heads
    kernel = cuda.sdpa_kernel(torch.float32 if e == 4 else torch.float16, hkv < h, None, flash)
    math_path = not eager and kernel == "math"
    lse = 0 if math_path else 4 * t.heads * T  # fp32 log-sum-exp per head and token (fused kernels)
    if eager:
        scores = (4 + e) * t.heads * seq * T  # fp32 softmax output + its cast for P @ V
    elif math_path:
        scores = e * t.heads * seq * T + 2 * e * (h - hkv) * T
    else:
        scores = 0
    if t.experts:
        mlp = _experts_saved(t, T, e, frozen)
    elif t.gated_mlp:
        mlp = (3 if frozen else 4) * e * i * T  # gate, SiLU(gate), up (+ their product for a trainable down)
    else:
        mlp = (1 if frozen else 2) * e * i * T  # the GELU input (+ its output for a trainable fc_out)
    masks = int(3 * h * T + (t.heads * seq * T if eager else 0)) if t.dropout > 0 else 0
    lora = 5 * lora_in * T  # peft casts each adapter's input to fp32 (4) and drops out (1-byte mask)
    return norms + qkv + attn_out + lse + scores + mlp + masks + lora


def _experts_saved(t: Traits, T: int, e: int, frozen: bool) -> int:
    """Bytes a mixture-of-experts layer saves, as transformers' grouped experts run it (`grouped_mm`): every
    token-expert pair is a row, S = top-k x tokens, whatever the routing. The router's logits and fp32
    probabilities; the gated up projection's output and the activation of its gate (3 x S x FFN); the down
    projection's masked output, which the routing weights multiply (S x hidden); the sort's indices. Trainable
    experts also keep each product's input for their weight gradients (S x hidden, S x FFN). Shared experts
    are a dense gated MLP over every token."""
    S = t.top_k * T
    routed = (3 if frozen else 4) * e * t.expert_ffn * S + (1 if frozen else 2) * e * t.hidden * S
    router = (e + 4) * t.experts * T + 24 * S
    shared = (3 if frozen else 4) * e * t.shared_ffn * T
    return routed + router + shared


@dataclass(frozen=True)
class ActivationTerms:
    saved: int
    """Bytes alive at the end of forward (all layers, final norm, log-softmax)."""
    backward_transient: int
    """Extra bytes at the start of backward (logit gradients), or in a recomputed layer."""
    terms: dict[str, int]


def activations(t: Traits, batch: int, seq: int, e: int, r: int, checkpointing: bool, eager: bool,
                lora_in: int = 0, frozen: bool = False, flash: bool = True) -> ActivationTerms:
    T = batch * seq
    per_layer = layer_saved(t, T, seq, e, r, eager, lora_in, frozen, flash)
    logits = 4 * t.vocab * T  # fp32 log-softmax output kept by cross-entropy (transformers 5 upcasts)
    final_norm = (4 + r + e) * t.hidden * T if t.norm == "rms" else (r + e) * t.hidden * T
    if checkpointing:
        # non-reentrant checkpointing keeps each layer's input; one layer is recomputed at a time
        layers, recompute = t.layers * r * t.hidden * T, per_layer
    else:
        layers, recompute = t.layers * per_layer, 0
    logit_grads = int(runtime.LOGITS_BACKWARD_BYTES * t.vocab * T)
    terms = {"layers": layers, "per_layer": per_layer, "final_norm": final_norm, "log_softmax": logits,
             "logit_gradients": logit_grads, "recomputed_layer": recompute}
    return ActivationTerms(layers + final_norm + logits, max(logit_grads, recompute), terms)
