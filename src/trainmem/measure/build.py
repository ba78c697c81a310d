"""Build what a setup trains: the real Hugging Face model (full, LoRA or QLoRA) and its optimizer.

Presets and bare configs have no weights offline, so they are initialised randomly, directly on the
target device; memory does not depend on the values. QLoRA quantizes on load, so a random-weight QLoRA
model is first written to a temporary folder with `save_pretrained` and loaded back through the same
`from_pretrained(quantization_config=...)` path a real checkpoint takes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import torch

from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import TrainSetup, peft_targets
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.hardware.cuda import FLASH_ATTENTIONS, MAMBA_FAMILIES

WEIGHT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                 "amp-bf16": torch.float32, "amp-fp16": torch.float32}
AUTOCAST_DTYPES = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}


def has_bitsandbytes() -> bool:
    """Whether bitsandbytes is importable: QLoRA and the 8-bit optimizers need it, and it is an optional extra."""
    return importlib.util.find_spec("bitsandbytes") is not None


def has_liger() -> bool:
    """Whether liger-kernel is importable: `--kernels liger` needs it (and Triton, which CUDA builds of torch carry)."""
    return importlib.util.find_spec("liger_kernel") is not None


def has_mamba_kernels() -> bool:
    """Whether mamba-ssm and causal-conv1d are importable: transformers then binds their kernels into a Mamba
    mixer's modeling module (`--mamba-path kernels`)."""
    return all(importlib.util.find_spec(name) is not None for name in ("mamba_ssm", "causal_conv1d"))


FLASH_MODULES = {2: "flash_attn", 3: "flash_attn_interface"}
"""The module transformers imports for each FlashAttention version (modeling_flash_attention_utils `_lazy_imports`)."""


def has_flash_attn(attention: str) -> bool:
    """Whether the flash-attn build that `attention` (`flash_attention_2` / `_3`) calls is importable."""
    return importlib.util.find_spec(FLASH_MODULES[FLASH_ATTENTIONS[attention]]) is not None


def _cpu_runs(dtype: torch.dtype) -> bool:
    try:
        w = torch.randn(8, 8, dtype=dtype, requires_grad=True)
        (w @ w).sum().backward()
        return True
    except RuntimeError:
        return False


def _deepspeed_problems(setup: TrainSetup, precision: str, launched: bool) -> list[str]:
    """What `--engine deepspeed` (`trainmem.measure.deepspeed`) cannot run here, each with its fix."""
    out = []
    if importlib.util.find_spec("deepspeed") is None:
        out.append("--engine deepspeed: needs DeepSpeed, which is not installed (DS_BUILD_OPS=0 pip install "
                   "deepspeed); or predict the rank with trainmem estimate")
    if precision not in ("bf16", "amp-bf16", "fp32"):
        out.append(f"--precision {precision}: the DeepSpeed engine runs bf16, amp-bf16 and fp32 (DeepSpeed's fp16 "
                   "needs its own loss scaler); use --precision bf16")
    if setup.peft == "qlora":
        out.append("--peft qlora: the DeepSpeed engine does not run 4-bit weights; use --peft lora or none")
    if launched:
        out.append("--launch: the DeepSpeed engine runs one rank through the fake group; drop --launch")
    return out


def environment_problems(setup: TrainSetup, device: str, precision: str, launched: bool = False) -> list[str]:
    """Problems that depend on this machine: missing CUDA or bitsandbytes, dtypes the CPU lacks. `launched`: a
    rank under torchrun (`run --launch`), which has a GPU of its own, so DDP runs on CUDA too."""
    out: list[str] = []
    if setup.distributed:
        predict = f"predict them with trainmem estimate --gpus {setup.gpus} --shard {setup.shard}"
        deepspeed = setup.engine == "deepspeed"
        if setup.shard.startswith("zero") and not deepspeed:
            out.append(f"--shard {setup.shard}: a ZeRO rank is measured through DeepSpeed; add --engine deepspeed "
                       f"(one rank through the fake group), or {predict}")
        elif deepspeed:
            out.extend(_deepspeed_problems(setup, precision, launched))
        elif device == "cuda" and setup.shard != "fsdp" and not launched:
            out.append(f"--gpus {setup.gpus} --device cuda --shard {setup.shard}: only FSDP2 ranks are emulated "
                       f"on one GPU (--shard fsdp); use --device cpu for gloo processes, --launch for N GPUs, "
                       f"or {predict}")
        if setup.offload != "none" and not deepspeed:
            out.append(f"--offload {setup.offload}: measured offload runs go through DeepSpeed; add --engine "
                       f"deepspeed --shard zero1|zero2|zero3, or {predict}")
        if setup.engine in ("trainer", "sft"):
            out.append(f"--engine {setup.engine}: multi-process runs use the built-in loop; use --engine loop")
    row = OPTIMIZERS.get(setup.optimizer)
    needs_bnb = setup.peft == "qlora" or (row is not None and row.eight_bit)
    if device == "cuda" and not torch.cuda.is_available():
        out.append("--device cuda: no CUDA device is visible; use --device cpu")
    if needs_bnb and not has_bitsandbytes():
        what = "--peft qlora" if setup.peft == "qlora" else f"--optimizer {setup.optimizer}"
        out.append(f"{what}: needs bitsandbytes, which is not installed "
                   "(pip install 'trainmem[qlora]' on a CUDA machine)")
    if setup.kernels == "liger" and device == "cpu":
        out.append("--kernels liger: Liger's kernels are Triton kernels, which run on CUDA only; use --device cuda "
                   "or --kernels none")
    elif setup.kernels == "liger" and not has_liger():
        out.append("--kernels liger: needs liger-kernel, which is not installed (pip install liger-kernel on a "
                   "CUDA machine)")
    if setup.attention in FLASH_ATTENTIONS and device == "cpu":
        out.append(f"--attention {setup.attention}: flash-attn's kernels run on CUDA only; use --device cuda or "
                   "--attention sdpa")
    elif setup.attention in FLASH_ATTENTIONS and not has_flash_attn(setup.attention):
        module = FLASH_MODULES[FLASH_ATTENTIONS[setup.attention]]
        out.append(f"--attention {setup.attention}: needs the flash-attn package ({module}), which is not installed; "
                   "`trainmem estimate` prices it from flash-attn's sources, or use --attention sdpa")
    if setup.engine == "sft" and importlib.util.find_spec("trl") is None:
        out.append("--engine sft: needs TRL, which is not installed (pip install 'trainmem[trl]'); or use "
                   "--engine trainer")
    if setup.mamba_path == "kernels" and not has_mamba_kernels():
        out.append("--mamba-path kernels: cannot run here, as mamba-ssm and causal-conv1d are not installed (pip "
                   "install mamba-ssm causal-conv1d on a CUDA machine); `trainmem estimate` prices it, or use "
                   "--mamba-path torch")
    if setup.peft == "qlora" and device == "cpu":
        out.append("--peft qlora: 4-bit NF4 training runs on CUDA only here; use --device cuda or "
                   "--peft lora on the CPU")
    if row is not None and row.paged and device == "cpu":
        out.append(f"--optimizer {setup.optimizer}: paged states live in CUDA managed memory; use "
                   "--optimizer adamw-8bit or a CUDA device")
    if device == "cpu":
        dtype = AUTOCAST_DTYPES.get(precision, WEIGHT_DTYPES.get(precision))
        if dtype not in (None, torch.float32) and not _cpu_runs(dtype):
            out.append(f"--precision {precision}: this CPU's PyTorch cannot train in {dtype}; "
                       "use --precision fp32")
    if device == "cuda" and torch.cuda.is_available():
        cap = setup.cap_bytes(precision)
        total = torch.cuda.get_device_properties(0).total_memory
        if cap is not None and cap > total:
            flag = f"--gpu {setup.gpu}" if setup.gpu else "--memory-cap"
            out.append(f"{flag}: caps memory at {cap / 2**30:.2f} GiB, more than this card's "
                       f"{total / 2**30:.2f} GiB; a cap can only make a card smaller")
        if precision in ("bf16", "amp-bf16") and not torch.cuda.is_bf16_supported():
            out.append(f"--precision {precision}: this GPU has no bf16; use fp16 or amp-fp16")
    return out


def lora_config(setup: TrainSetup, spec: ModelSpec | None = None) -> Any:
    """The peft `LoraConfig` of a setup: one place, so that the run, the estimator's meta model and the
    QLoRA simulation adapt exactly the same modules."""
    from peft import LoraConfig

    # peft takes the string "all-linear" (every Linear but the output head) or a regex, not a list holding one
    experts = list(spec.expert_parameters) if setup.lora_experts and spec is not None else None
    return LoraConfig(r=setup.lora_r, lora_alpha=setup.lora_alpha, lora_dropout=setup.lora_dropout,
                      target_modules=peft_targets(setup.lora_targets), target_parameters=experts, bias="none",
                      task_type="CAUSAL_LM")


def random_model(spec: ModelSpec, dtype: torch.dtype, attention: str, device: str) -> torch.nn.Module:
    """The model of `spec`'s config with random weights, built directly on `device` (`meta`: no memory, for
    the estimator's simulation of the same model). Parameters that a factory made on the CPU despite the device
    context (DiffLlama's `torch.normal(mean, std, size=...)` lambdas, XLNet's `torch.FloatTensor`) are moved to
    `device` after the others, as `from_pretrained(device_map=...)` places them; on meta a CPU parameter could not
    take its meta gradient."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(spec.hf_config(), dtype=dtype, attn_implementation=attention)
    where = torch.device(device).type
    if any(t.device.type != where for t in (*model.parameters(), *model.buffers())):
        model.to(device)
    return model


def add_adapters(model: torch.nn.Module, setup: TrainSetup, spec: ModelSpec | None = None) -> torch.nn.Module:
    """The model with the setup's LoRA adapters (peft's `get_peft_model`), or as it is without LoRA."""
    if setup.peft not in ("lora", "qlora"):
        return model
    from peft import get_peft_model

    return get_peft_model(model, lora_config(setup, spec))


def init_device(spec: ModelSpec, dtype: torch.dtype, cap: int | None, free: int) -> str:
    """Where a QLoRA preset's random 16-bit weights are made before the 4-bit load: the GPU (fast) where
    they fit with a tenth to spare under the cap (`--gpu`, `--memory-cap`) and the free memory, else the
    CPU. A user's checkpoint never takes this detour: llama-3.1-8b (16 GB in bf16) under the A4000's cap
    ran out of memory here, before its 4-bit load (docs/lab)."""
    need = spec.parameter_count * torch.empty((), dtype=dtype).element_size()
    room = min(free, cap) if cap is not None else free
    return "cuda" if need <= 0.9 * room else "cpu"


def _torch_mamba(model: torch.nn.Module) -> None:
    """transformers' PyTorch Mamba functions back in the model's modeling module where mamba-ssm is installed
    (`--mamba-path torch`): each kernel-bound name wraps its fallback (`__wrapped__`)."""
    import sys

    module = sys.modules[type(model).__module__]
    for name in ("mamba2_split_conv1d_scan_combined", "mamba_inner_fn", "mamba_selective_scan", "causal_conv1d_fn",
                 "mamba2_chunk_scan"):
        fn = getattr(module, name, None)
        if getattr(fn, "__wrapped__", None) is not None:
            setattr(module, name, fn.__wrapped__)


def build_model(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> torch.nn.Module:
    """The model, on `device`, in training mode, with checkpointing and adapters as the setup says. On `meta`
    (an FSDP2 rank, before `materialise`) a checkpoint's config is built without its weights: no memory."""
    from transformers import AutoModelForCausalLM

    setup = setup.resolved(spec)  # callers that never validated with the spec (verify) may still say auto

    torch.manual_seed(setup.seed)
    dtype = WEIGHT_DTYPES[precision]
    if setup.peft == "qlora":
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        compute = dtype if dtype != torch.float32 else AUTOCAST_DTYPES.get(precision, torch.float32)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute)
        kwargs = dict(dtype=dtype, attn_implementation=setup.attention, quantization_config=quant,
                      device_map={"": 0})
        if spec.has_weights:
            model = AutoModelForCausalLM.from_pretrained(spec.path, **kwargs)
        else:
            with tempfile.TemporaryDirectory(prefix="trainmem-qlora-") as tmp:
                # Random init is fast on the GPU; the unquantized copy is freed and forgotten by the
                # allocator's statistics before the real (quantizing) load starts.
                where = init_device(spec, dtype, setup.cap_bytes(precision), torch.cuda.mem_get_info()[0])
                random_model(spec, dtype, setup.attention, where).save_pretrained(tmp)
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                model = AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=setup.checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        if spec.has_weights and device != "meta":
            model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=dtype, attn_implementation=setup.attention,
                                                         device_map={"": device})
        else:
            model = random_model(spec, dtype, setup.attention, device)
        if setup.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # training never reads the KV cache; the seed turns it off too
    if setup.kernels == "liger":  # before LoRA, as users apply it (the Trainer's use_liger_kernel does it again)
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    if setup.mamba_path == "torch" and spec.model_type in MAMBA_FAMILIES and has_mamba_kernels():
        _torch_mamba(model)
    with torch.device("meta") if device == "meta" else contextlib.nullcontext():  # peft makes adapters on the CPU
        model = add_adapters(model, setup, spec)
    model.train()
    return model


def materialise(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """Allocate a meta-built model's tensors on `device` and give them values, as torchtitan starts an FSDP2 rank:
    after `fully_shard`, `to_empty` allocates only this rank's (padded) shards. transformers' own initialisation
    (`initialize_weights`: normal weights, ones for norms, rotary frequencies recomputed from the config) then fills
    them; from_config marked every module and tied weight as initialised, so the marks are dropped first. Under
    `implicit_replication` a plain tensor an init function copies in (Mamba's `A_log`, a rotary table) counts as
    replicated, and each rank keeps its own chunk of it. LoRA B starts at zero, as peft starts it. Memory does not
    depend on the values; finite ones keep the loss finite."""
    from torch.distributed.tensor.experimental import implicit_replication

    model.to_empty(device=device)
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    for obj in (*hf.modules(), *hf.parameters(), *hf.buffers()):
        if getattr(obj, "_is_hf_initialized", False):
            delattr(obj, "_is_hf_initialized")
    with torch.no_grad(), implicit_replication(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DTensor random operators")  # a CPU mesh: local random, fine here
        hf.initialize_weights()
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.zero_()
    return model


def build_optimizer(model: torch.nn.Module, setup: TrainSetup) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters only (frozen ones get no state)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SetupError(["--peft: the model has no trainable parameters; check --lora-targets"])
    return BUILDERS[setup.optimizer](params, setup.lr)


def _adafactor(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # An explicit learning rate, as Hugging Face recommends for fine-tuning with Adafactor.
    return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)


def _bnb(name: str) -> Callable[[list[torch.nn.Parameter], float], torch.optim.Optimizer]:
    def build(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        import bitsandbytes as bnb

        return getattr(bnb.optim, name)(params, lr=lr)
    return build


BUILDERS: dict[str, Callable[[list[torch.nn.Parameter], float], torch.optim.Optimizer]] = {
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr),
    "adamw-fused": lambda params, lr: torch.optim.AdamW(params, lr=lr, fused=True),
    "adamw-8bit": _bnb("AdamW8bit"),
    "paged-adamw-8bit": _bnb("PagedAdamW8bit"),
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr),
    "adafactor": _adafactor,
}
"""`--optimizer` name -> what builds it over the trainable parameters at a learning rate: the one place besides
its row in `config.optimizers.OPTIMIZERS` that a new optimizer needs (tests/unit/test_optimizers.py holds both
to the same names)."""


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter counts; 4-bit weights count their logical elements."""
    trainable = total = 0
    for p in model.parameters():
        n = p.numel() * (2 if p.dtype == torch.uint8 and hasattr(p, "quant_state") else 1)
        total += n
        if p.requires_grad:
            trainable += n
    return trainable, total
