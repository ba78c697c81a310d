"""Model states without a GPU: the bytes of weights, gradients and optimizer states, from the real model
built on the meta device (no memory, no init) with its LoRA adapters, and closed-form rules per dtype,
quantization and optimizer. Each rule cites where its bytes come from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec

NF4_BLOCK, NESTED_BLOCK = 64, 256


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    trainable: bool
    bytes_per: float
    """Bytes per element as stored (0.5 for packed NF4)."""
    quantized: bool = False
    reached: bool = True
    """The loss reaches it (`reached`): a trainable parameter it never reaches gets no gradient, and so no
    optimizer state, in a real step."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def updated(self) -> bool:
        """Takes a gradient and optimizer states: trainable and reached by the loss."""
        return self.trainable and self.reached


@dataclass(frozen=True)
class Inventory:
    params: tuple[Param, ...]
    buffers: int
    model: Any
    """The meta-device model, for structure (traits) and for the simulation."""


TOP_K_FIELDS = ("num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_selected_experts")
"""Config fields that name how many experts each token runs, across transformers' MoE families."""


def experts_per_token(cfg: Any) -> int | None:
    """How many experts each token of a mixture of experts runs (its top-k), None where the config names none."""
    return next((getattr(cfg, f) for f in TOP_K_FIELDS if isinstance(getattr(cfg, f, None), int)), None)


def weight_bytes_per(precision: str) -> int:
    return 2 if precision in ("fp16", "bf16") else 4


def meta_model(spec: ModelSpec, setup: TrainSetup, precision: str) -> Any:
    """The real Hugging Face model (and peft adapters) on the meta device, in the weights' dtype, built by the
    builder `trainmem run` uses (`measure.build`); flash-attn's attention (not installed here) by its stand-in
    (`standins.use_flash`)."""
    from trainmem.measure.build import WEIGHT_DTYPES, add_adapters, random_model

    from trainmem.hardware.cuda import FLASH_ATTENTIONS

    from .standins import use_flash

    setup = setup.resolved(spec)
    flash = setup.attention in FLASH_ATTENTIONS  # built with SDPA, then pointed at the FlashAttention stand-in
    model = random_model(spec, WEIGHT_DTYPES[precision], "sdpa" if flash else setup.attention, "meta")
    if flash:
        use_flash(model, setup.attention)
    model.config.use_cache = False
    with torch.device("meta"):
        return add_adapters(model, setup, spec)


def quantizable(model: Any) -> set[str]:
    """Names of the layers bitsandbytes converts to 4-bit, as transformers picks them (integrations/bitsandbytes.py
    `replace_with_bnb_linear`: `isinstance(module, Conv1D) or type(module) is nn.Linear`): every exact nn.Linear
    and GPT-2's Conv1D, not a Linear subclass (Falcon's FalconLinear stays 16-bit), and not the output head
    (`get_keys_to_not_convert` keeps `lm_head` / the output embeddings unquantized)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    return {name for name, mod in model.named_modules()
            if (type(mod) is torch.nn.Linear or isinstance(mod, Conv1D)) and mod is not head and "lora_" not in name}


_CACHE: dict[tuple, Inventory] = {}


def inventory(spec: ModelSpec, setup: TrainSetup, precision: str) -> Inventory:
    """The parameter inventory, cached per model and per what changes the parameter set (batch and
    sequence length do not rebuild it, which keeps the analytic method in milliseconds)."""
    key = (spec.name, repr(sorted(spec.config.items())), setup.peft, setup.lora_r, repr(setup.lora_targets),
           setup.lora_experts, setup.attention, precision)
    if key not in _CACHE:
        _CACHE[key] = _build_inventory(spec, setup, precision)
    return _CACHE[key]


REACH_TOKENS = 32
"""The length of the one sample `reached` runs (at most the model's positions): what the loss reaches does not
depend on it in any model of the registry (docs/models.md), and a fixed length keeps the cached inventory the
same whichever setup built it."""


def reached(model: Any, spec: ModelSpec) -> set[str] | None:
    """Names of the trainable parameters that get a gradient from a training step's loss: one forward and backward
    of one sample on the meta device under the simulation's CUDA stand-ins (torch's own SDPA, which, unlike the
    fused-kernel stand-in, passes a gradient to a learned float mask: Doge's, Inkling's), then the parameters
    holding a `.grad`, dropped again. None where that step fails on meta (then every trainable parameter counts).
    What it leaves out gets no gradient in a real step either: a decoder's cross-attention with no encoder (BART,
    Whisper, TrOCR), a vision or audio tower with no image (Mllama, Phi-4-multimodal), a sparse-attention indexer
    behind its top-k (DeepSeek-V3.2, GLM-MoE-DSA). A backward, not a walk of the graph: Reformer's reversible
    layers take their weights' gradients inside a custom autograd function, which no graph edge shows."""
    from .standins import cuda_choices

    ids = torch.zeros((1, min(REACH_TOKENS, spec.max_positions or REACH_TOKENS)), dtype=torch.long, device="meta")
    training = model.training
    model.train()
    try:
        with torch.enable_grad(), cuda_choices("eager", zeros=(ids,)):
            model(input_ids=ids, labels=ids).loss.backward()
    except Exception:  # a step the meta device cannot run (a value that depends on weights): count them all
        return None
    finally:
        model.train(training)
    out = {name for name, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return out


REACH_CUT = 3
"""The depth of the cut model whose step says what the loss reaches in a deep model of alike layers
(`reached_by_cut`): its first, a middle and its last layer."""


def reached_by_cut(model: Any, spec: ModelSpec, setup: TrainSetup, precision: str) -> set[str] | None:
    """`reached(model, spec)`, read from the model cut to `REACH_CUT` layers where its decoder layers are alike
    and deep enough that its step is composed from cut models (`compose.uniform`, `compose.MIN_LAYERS`): the
    first layer as the cut's first, the last as its last, every other as its middle one. A step of the whole
    model costs a second for an 8B and more for a 70B; one of three layers, a tenth of that. None where the
    cut's step fails (as `reached`); the whole model's step where the layers differ, are too few, or a name
    does not map onto the cut model."""
    from .compose import MIN_LAYERS, uniform

    text = spec.config.get("text_config") if isinstance(spec.config.get("text_config"), dict) else spec.config
    layers = int(spec.text_config().num_hidden_layers)
    if layers < MIN_LAYERS or not uniform(str(text.get("model_type", spec.config.get("model_type"))), text):
        return reached(model, spec)
    names = _layer_names(model, layers)
    if names is None:
        return reached(model, spec)
    short = spec.cut(REACH_CUT)
    cut = meta_model(short, setup, precision)
    known = {name for name, _ in cut.named_parameters()}
    mapped: dict[str, str] = {}
    for name, _ in model.named_parameters():
        where = _in_layer(name, names)
        if where is not None:
            prefix, i, rest = where
            name_in_cut = f"{prefix}.{0 if i == 0 else REACH_CUT - 1 if i == layers - 1 else 1}{rest}"
        else:
            name_in_cut = name
        if name_in_cut not in known:
            return reached(model, spec)
        mapped[name] = name_in_cut
    hit = reached(cut, short)
    return None if hit is None else {name for name, at in mapped.items() if at in hit}


def _layer_names(model: Any, layers: int) -> dict[str, tuple[str, int]] | None:
    """Each decoder layer's qualified name -> (its list's name, its index), where the model has `layers` of them
    in one list (the modules FSDP2 shards as units: `fsdp.decoder_layers`), else None."""
    from trainmem.fsdp import decoder_layers

    ids = {id(m) for m in decoder_layers(model)}
    out: dict[str, tuple[str, int]] = {}
    for name, m in model.named_modules():
        prefix, _, index = name.rpartition(".")
        if id(m) in ids and index.isdigit():
            out[name] = (prefix, int(index))
    if len(out) != layers or len({prefix for prefix, _ in out.values()}) != 1:
        return None
    return out


def _in_layer(name: str, layers: dict[str, tuple[str, int]]) -> tuple[str, int, str] | None:
    """(the layers' list, the layer's index, the rest of the name) of a parameter inside a decoder layer."""
    for at in (i for i, c in enumerate(name) if c == "."):
        found = layers.get(name[:at])
        if found is not None:
            return found[0], found[1], name[at:]
    return None


def _build_inventory(spec: ModelSpec, setup: TrainSetup, precision: str) -> Inventory:
    model = meta_model(spec, setup, precision)
    wd = weight_bytes_per(precision)
    quant = quantizable(model) if setup.peft == "qlora" else set()
    hit = reached_by_cut(model, spec, setup, precision)
    params = []
    for name, p in model.named_parameters():
        module, _, kind = name.rpartition(".")
        reach = hit is None or name in hit
        if module in quant and kind == "weight":
            params.append(Param(name, tuple(p.shape), False, 0.5, quantized=True))
        elif module in quant:
            # the bias of a 4-bit Linear stays in the load dtype (measured: not upcast by peft)
            params.append(Param(name, tuple(p.shape), False, wd))
        elif "lora_" in name or setup.peft == "qlora":
            # peft keeps adapters in fp32 (autocast_adapter_dtype); prepare_model_for_kbit_training casts
            # every other non-4-bit parameter to fp32
            params.append(Param(name, tuple(p.shape), p.requires_grad, 4, reached=reach))
        else:
            params.append(Param(name, tuple(p.shape), p.requires_grad, wd, reached=reach))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return Inventory(tuple(params), buffers, model)


def quantized_bytes(n: int) -> int:
    """NF4 with double quantization (QLoRA paper, section 3): n/2 packed bytes, one uint8 absmax per 64
    values, re-quantized with one fp32 absmax per 256 of those, plus the 256-entry fp32 code of the
    nested quantization and the 16-entry NF4 code."""
    blocks = math.ceil(n / NF4_BLOCK)
    return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / NESTED_BLOCK) + 4 * 256 + 4 * 16


def weights(inv: Inventory) -> int:
    return inv.buffers + sum(quantized_bytes(p.numel) if p.quantized else int(p.numel * p.bytes_per)
                             for p in inv.params)


def gradients(inv: Inventory) -> int:
    """One gradient per trainable parameter the loss reaches, in the parameter's dtype."""
    return sum(int(p.numel * p.bytes_per) for p in inv.params if p.updated)


def optimizer(inv: Inventory, name: str) -> int:
    """Optimizer state bytes after the first step: the row's rule (`config.optimizers`) over every trainable
    tensor the loss reaches (torch's optimizers skip a parameter whose grad is None)."""
    row = OPTIMIZERS[name]
    return row.shared_bytes + sum(row.state_bytes(p.numel, tuple(p.shape), int(p.bytes_per))
                                  for p in inv.params if p.updated)
