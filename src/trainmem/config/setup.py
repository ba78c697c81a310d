"""TrainSetup: one fine-tuning setup, typed, validated once, shared by `run` and `estimate`.

Defaults mirror the seed chapter (batch 4, sequence 256, AdamW, LoRA r=8/alpha=32/dropout 0.05).
Validation collects every problem and raises one `SetupError`, each line naming the flag to change.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainmem.errors import SetupError
from trainmem.hardware.cuda import (
    FLASH_ATTENTIONS,
    LIGER_FAMILIES,
    MAMBA_FAMILIES,
    MAMBA_PATHS,
    flash_attention_problem,
)
from trainmem.hardware.gpus import find_gpu, gpu_problem
from trainmem.hardware.interconnect import network_problem

from .optimizers import OPTIMIZERS as OPTIMIZER_TABLE
from .optimizers import by_trainer_name, trainer_name

PEFTS = ("none", "lora", "qlora")
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "amp-bf16", "amp-fp16")
OPTIMIZERS = tuple(OPTIMIZER_TABLE)
ATTENTIONS = ("auto", "sdpa", "eager", *FLASH_ATTENTIONS)
LABELS = ("random", "copy")
DATA_MODES = ("pad", "pack")
DEVICES = ("auto", "cuda", "cpu")
ENGINES = ("loop", "trainer", "sft", "deepspeed")
KERNELS = ("none", "liger")
ESTIMATORS = ("auto", "analytic", "simulate")
"""How `trainmem.estimate` predicts (defined here, torch-free, so that the CLI's help needs no estimator)."""
SHARDS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")
OFFLOADS = ("none", "optimizer", "params")


@dataclass
class TrainSetup:
    """Everything about a fine-tuning run except the model itself."""

    batch_size: int = 4
    """Micro-batch: samples per forward/backward (the seed's `per_device_train_batch_size`)."""
    grad_accum: int = 1
    """Micro-batches whose gradients are summed before one optimizer step."""
    seq_len: int = 256
    """Tokens per sample of the dummy data; the maximum length for `data`."""
    checkpointing: bool = False
    """Gradient checkpointing (non-reentrant): keep layer inputs, recompute the rest in backward."""
    peft: str = "none"
    """`none` (full fine-tuning), `lora`, or `qlora` (NF4 base weights via bitsandbytes + LoRA)."""
    lora_r: int = 8
    """LoRA rank: each adapted layer gets two matrices of rank r (the seed: 8); adapter bytes grow with r."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by alpha / r); no effect on memory."""
    lora_dropout: float = 0.05
    """Dropout on the adapters' input; its output and mask are kept for backward (activation memory)."""
    lora_targets: list[str] | None = None
    """Module names to adapt; None lets peft choose per architecture (query_key_value for GPT-NeoX)."""
    lora_experts: bool = False
    """Also adapt a mixture of experts' fused 3-D expert weights (peft's `target_parameters`, one low-rank pair
    per expert). peft then rebuilds each expert weight plus its update on every forward, a full-size tensor the
    backward keeps; it takes no dropout."""
    precision: str = "auto"
    """`auto` = the checkpoint's dtype on CUDA (the seed's torch_dtype="auto"), fp32 on CPU;
    fp16/bf16 = half weights, no autocast; amp-* = fp32 weights under autocast (GradScaler for fp16)."""
    optimizer: str = "adamw"
    """`adamw` (torch, foreach), `adamw-fused`, `adamw-8bit` / `paged-adamw-8bit` (bitsandbytes), `sgd` or
    `adafactor`: what the optimizer keeps per trainable parameter and what its step allocates."""
    lr: float = 1e-4
    """Learning rate; no effect on memory, recorded so that the run can be reproduced (see `lr_batch`)."""
    lr_batch: int | None = None
    """The effective batch `lr` was tuned for. When it differs from this setup's effective batch the run
    says so and suggests the linearly scaled rate, instead of silently reusing `lr`."""
    attention: str = "auto"
    """`auto` (what transformers picks for the model: sdpa where its class supports it, else eager),
    `sdpa`, `eager`, or flash-attn's `flash_attention_2` / `flash_attention_3` (Hopper), as transformers'
    `attn_implementation` names them: those need the flash-attn package to `run`, and fp16/bf16 q, k, v; the
    estimate prices them from flash-attn's sources (`trainmem.hardware.cuda.FLASH_ATTN_SOURCE`), not measured.
    `validate(spec)` makes `auto` the kernel it stands for, recorded in results."""
    kernels: str = "none"
    """`none` (transformers' own modules) or `liger`: liger-kernel's defaults for the model's family (its fused
    linear cross-entropy, which never holds the logits, and its RMSNorm, SwiGLU and RoPE kernels), applied by
    `run` as `apply_liger_kernel_to_<family>` applies them and priced by the estimate from liger-kernel's
    sources (`trainmem.hardware.cuda.LIGER_FAMILIES`)."""
    mamba_path: str = "torch"
    """Which path a Mamba mixer (hybrid and Mamba models: `trainmem.hardware.cuda.MAMBA_FAMILIES`) takes on the
    training machine: `torch` (transformers' PyTorch chunked scan, taken where mamba-ssm is not installed, and
    the path measured on GPUs here) or `kernels` (mamba-ssm's and causal-conv1d's fused kernels, priced from
    their sources: `trainmem.hardware.cuda.MAMBA_SOURCE`). The estimate of such a model also gives the other
    path's figure."""
    steps: int = 3
    """Optimizer steps. Adam states exist only after step 1, so step 2 is the first steady one."""
    labels: str = "random"
    """Dummy data labels: `random` (the seed: independent ids) or `copy` (labels = inputs)."""
    num_samples: int = 64
    """Dummy data samples (the seed: 64); raised to `batch_size` when smaller (see `dummy_samples`)."""
    data: str | None = None
    """A local .txt (one sample per line) or .jsonl (a "text" field) file instead of dummy data."""
    data_mode: str = "pad"
    """How `data` becomes batches: `pad` (attention mask, labels -100 on pads) or `pack`."""
    device: str = "auto"
    """`auto` (CUDA where visible, else the CPU), `cuda` or `cpu`: where `run` trains. Estimates are
    always for a CUDA GPU."""
    gpu: str | None = None
    """The card to judge against (see `trainmem.hardware.gpus.CATALOG`). `run` emulates it on a bigger card: the
    allocator capped at its usable memory and, with CUDA, its cuBLAS workspace and SDPA kernels
    (`trainmem.measure.emulation`); the host's context and timings stay the host's."""
    memory_cap: int | None = None
    """Cap usable memory to this many bytes (on CPU the tensor ledger enforces it)."""
    seed: int = 0
    """Seed of the random weights (presets and configs have none) and of the dummy data."""
    engine: str = "loop"
    """Who trains: `loop` (trainmem's own loop), `trainer` (transformers.Trainer + MemoryCallback), `sft` (TRL's
    SFTTrainer + MemoryCallback, whose fused LM head never builds the full logits) or `deepspeed` (DeepSpeed's
    ZeRO engine around trainmem's loop, one rank through the fake group: `trainmem.measure.deepspeed`)."""
    gpus: int = 1
    """Data-parallel GPUs: estimated; run as CPU processes over gloo, or one rank through the fake group (`rank`)."""
    shard: str = "none"
    """How states are spread over `gpus`: none, ddp, zero1, zero2, zero3 (DeepSpeed ZeRO) or fsdp."""
    offload: str = "none"
    """ZeRO/FSDP offload to CPU memory: none, optimizer, or params (the parameters and the optimizer states, as
    DeepSpeed's `offload_param` beside `offload_optimizer` and FSDP2's `CPUOffloadPolicy` place them)."""
    nodes: int = 1
    """Machines the `gpus` ranks span (`gpus` stays the world size and must split evenly over them). With
    `shard` fsdp and more than one node the run is HSDP: sharded within a node, replicated across nodes."""
    gpus_per_node: int | None = None
    """GPUs per machine; None: `gpus / nodes`. Given, `gpus` must equal `nodes * gpus_per_node` (the flags fill
    in `gpus` from it when `--gpus` is not given)."""
    network: str = "ib-ndr"
    """The link between nodes, per GPU (`trainmem.hardware.interconnect.NETWORKS`): what cross-node collectives
    are timed over."""
    rank: int | str | None = None
    """Run: emulate this rank (0..gpus-1, or `all` in turn) of the `gpus`-rank FSDP2 run (or, with `engine`
    deepspeed, ZeRO run) in one process through PyTorch's fake process group (see `trainmem.measure.fake_rank`
    and `trainmem.measure.deepspeed`)."""

    # --- derived ----------------------------------------------------------------------------
    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation x data-parallel GPUs."""
        return self.batch_size * self.grad_accum * self.gpus

    @property
    def distributed(self) -> bool:
        """Whether this is one rank of a run on several GPUs (or a sharded one): the one place that says so."""
        return self.gpus > 1 or self.shard != "none"

    @property
    def per_node(self) -> int:
        """GPUs on each node: the world size over the nodes."""
        return self.gpus // max(self.nodes, 1)

    @property
    def hsdp(self) -> bool:
        """FSDP over several nodes: shard within a node, replicate across nodes (FSDP2's HSDP)."""
        return self.shard == "fsdp" and self.nodes > 1

    @property
    def shard_group(self) -> int:
        """Ranks a state is sharded over: a node's GPUs under HSDP, else the whole world. A rank of HSDP over
        M nodes of N GPUs holds what a rank of FSDP over N GPUs holds."""
        return self.per_node if self.hsdp else self.gpus

    def lr_note(self) -> str | None:
        """A warning when `lr` was tuned for another effective batch (linear scaling, Goyal et al. 2017)."""
        if self.lr_batch is None or self.lr_batch == self.effective_batch:
            return None
        scaled = self.lr * self.effective_batch / self.lr_batch
        return (f"--lr {self.lr:g} was tuned for an effective batch of {self.lr_batch}, this setup's is "
                f"{self.effective_batch}; the linear scaling rule suggests --lr {scaled:.3g}")

    def resolved_device(self) -> str:
        """`auto` becomes `cuda` where a CUDA device is visible, else `cpu`."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_precision(self, spec: Any, device: str) -> str:
        """`auto` becomes fp16/bf16 from the checkpoint dtype on CUDA and fp32 on CPU."""
        if self.precision != "auto":
            return self.precision
        if device == "cpu":
            return "fp32"
        return {"float16": "fp16", "bfloat16": "bf16"}.get(spec.stored_dtype, "fp32")

    def cap_bytes(self, precision: str | None = None) -> int | None:
        """The memory cap in bytes from `memory_cap` or `gpu` (the card's `allocator_cap` for this
        setup's attention, precision and method), the smaller if both are given. `precision`: the
        resolved one, where this setup's is still `auto`."""
        gpu = find_gpu(self.gpu) if self.gpu else None
        card_cap = gpu.allocator_cap(self.attention, precision or self.precision, self.peft) if gpu else None
        caps = [c for c in (self.memory_cap, card_cap) if c is not None]
        return min(caps) if caps else None

    def replace(self, **changes: Any) -> TrainSetup:
        """A copy with `changes`; unvalidated again (see `validate`)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as the row's `setup` and the worker's job record it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainSetup:
        """A setup from its fields; an unknown field is a SetupError, not silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SetupError([f"unknown setup field {k!r}" for k in unknown])
        return cls(**d)

    @classmethod
    def from_training_arguments(cls, args: Any, model: Any = None, **overrides: Any) -> TrainSetup:
        """The setup a transformers `TrainingArguments` (and, if given, its model) describes."""
        return from_training_arguments(args, model, **overrides)

    def to_training_arguments(self, output_dir: str, kind: Any = None, **more: Any) -> Any:
        """A `TrainingArguments` with this setup's batch, accumulation, checkpointing, autocast, optimizer,
        lr, seed and steps; `more` sets any other field. Pure fp16/bf16/fp32 are the model's dtype, not
        an argument: build the model in that dtype (trainmem.measure.build.build_model does). `kind`: a
        subclass to build instead (TRL's `SFTConfig`), whose own fields go in `more`."""
        from transformers import TrainingArguments

        fields_ = dict(output_dir=output_dir, per_device_train_batch_size=self.batch_size,
                       gradient_accumulation_steps=self.grad_accum, gradient_checkpointing=self.checkpointing,
                       gradient_checkpointing_kwargs={"use_reentrant": False} if self.checkpointing else None,
                       bf16=self.precision == "amp-bf16", fp16=self.precision == "amp-fp16",
                       optim=trainer_name(self.optimizer), learning_rate=self.lr,
                       seed=self.seed, max_steps=self.steps, use_cpu=self.device == "cpu",
                       use_liger_kernel=self.kernels == "liger")
        fields_.update(more)
        return (kind or TrainingArguments)(**fields_)

    def dummy_samples(self) -> int:
        """How many dummy samples a run makes: `num_samples`, but never fewer than one full micro-batch.
        A batch larger than the data would silently train on smaller micro-batches and make every
        memory number (and max-batch's search) about a batch that never ran."""
        return max(self.num_samples, self.batch_size)

    # --- validation ---------------------------------------------------------------------------
    def problems(self, spec: Any = None) -> list[str]:
        """Every problem of this setup (and of it with `spec`), each naming its flag. Empty if fine."""
        out: list[str] = []

        def choice(flag: str, value: str, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                near = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
                out.append(f"--{flag}: {value!r} is not one of {', '.join(allowed)}"
                           + (f"; did you mean {near[0]}?" if near else ""))

        for flag, value in (("batch-size", self.batch_size), ("grad-accum", self.grad_accum),
                            ("seq-len", self.seq_len), ("steps", self.steps), ("num-samples", self.num_samples),
                            ("lora-r", self.lora_r), ("lora-alpha", self.lora_alpha), ("gpus", self.gpus),
                            ("lr-batch", 1 if self.lr_batch is None else self.lr_batch)):
            if not _whole(value) or value < 1:
                out.append(f"--{flag}: must be a whole number >= 1, got {value!r}")
            elif value > MAX_WHOLE:
                out.append(f"--{flag}: {value} is out of range; at most {MAX_WHOLE} (2**31 - 1)")
        if not isinstance(self.checkpointing, bool):
            out.append(f"--checkpointing: must be true or false, got {self.checkpointing!r}")
        if not _finite(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
            out.append(f"--lora-dropout: must be in [0, 1), got {self.lora_dropout!r}")
        if not _finite(self.lr) or self.lr <= 0:
            out.append(f"--lr: must be a finite number > 0, got {self.lr!r}")
        if not _whole(self.seed) or not -2**63 <= self.seed < 2**64:
            out.append(f"--seed: must be a whole number torch can seed with (-2**63 to 2**64 - 1), got {self.seed!r}")
        choice("peft", self.peft, PEFTS)
        choice("precision", self.precision, PRECISIONS)
        choice("optimizer", self.optimizer, tuple(OPTIMIZER_TABLE))  # read now: a row added at run time counts
        choice("attention", self.attention, ATTENTIONS)
        if self.attention in FLASH_ATTENTIONS and self.distributed:
            out.append(f"--attention {self.attention}: modelled on one GPU; drop --gpus and --shard, or use "
                       "--attention sdpa")
        if self.attention in FLASH_ATTENTIONS and self.precision == "fp32":
            out.append(f"--attention {self.attention}: flash-attn takes fp16/bf16 q, k, v only, and --precision fp32 "
                       "has no autocast to give it them; use --precision bf16 or amp-bf16, or --attention sdpa")
        choice("kernels", self.kernels, KERNELS)
        if self.kernels == "liger" and self.distributed:
            out.append("--kernels liger: modelled on one GPU; drop --gpus and --shard, or use --kernels none")
        choice("mamba-path", self.mamba_path, MAMBA_PATHS)
        if self.mamba_path == "kernels" and self.distributed:
            out.append("--mamba-path kernels: modelled on one GPU; drop --gpus and --shard, or use --mamba-path torch")
        choice("labels", self.labels, LABELS)
        choice("data-mode", self.data_mode, DATA_MODES)
        choice("device", self.device, DEVICES)
        choice("engine", self.engine, ENGINES)
        choice("shard", self.shard, SHARDS)
        choice("offload", self.offload, OFFLOADS)
        if self.engine == "deepspeed" and not str(self.shard).startswith("zero"):
            out.append(f"--engine deepspeed: runs a DeepSpeed ZeRO rank; add --shard zero1|zero2|zero3 (and --gpus N),"
                       f" not --shard {self.shard}")
        if _whole(self.gpus) and self.gpus > 1 and self.shard == "none":
            out.append(f"--gpus {self.gpus}: say how states are spread with --shard ddp|zero1|zero2|zero3|fsdp")
        if self.gpus == 1 and self.shard in SHARDS[1:] and self.offload == "none":  # one GPU offloading is a use
            out.append(f"--shard {self.shard}: needs --gpus N with N >= 2 (one GPU has nothing to spread states "
                       f"over); add --gpus 2 or more, or drop --shard")
        if self.offload != "none" and self.shard not in ("zero1", "zero2", "zero3", "fsdp"):
            out.append(f"--offload {self.offload}: needs --shard zero1|zero2|zero3|fsdp")
        if self.offload == "params" and self.shard not in ("zero3", "fsdp"):
            out.append("--offload params: only ZeRO-3 and FSDP shard (and so can offload) parameters")
        out.extend(self._node_problems())
        out.extend(self._rank_problems())
        if self.gpu is not None and not isinstance(self.gpu, str):
            out.append(f"--gpu: expected a card name, got {self.gpu!r}")
        elif self.gpu is not None and gpu_problem(self.gpu):
            out.append(gpu_problem(self.gpu))  # type: ignore[arg-type]
        elif self.gpu is not None:
            out += _card_problems(find_gpu(self.gpu), self.precision)  # type: ignore[arg-type]
            out += _flash_card_problems(find_gpu(self.gpu), self.attention, self.gpu)  # type: ignore[arg-type]
        if self.memory_cap is not None and (not _whole(self.memory_cap) or self.memory_cap < 1):
            out.append(f"--memory-cap: must be a positive number of bytes, got {self.memory_cap!r}")
        if self.lora_targets is not None and (not isinstance(self.lora_targets, list) or not self.lora_targets
                                              or not all(isinstance(t, str) and t for t in self.lora_targets)):
            out.append(f"--lora-targets: expected module names (e.g. q_proj,v_proj or all-linear), got "
                       f"{self.lora_targets!r}; leave it out for the defaults")
        elif self.peft == "none" and self.lora_targets:
            out.append("--lora-targets: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop "
                       "--lora-targets")
        if not isinstance(self.lora_experts, bool):
            out.append(f"--lora-experts: must be true or false, got {self.lora_experts!r}")
        elif self.lora_experts and self.peft == "none":
            out.append("--lora-experts: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop "
                       "--lora-experts")
        elif self.lora_experts and str(self.precision).startswith("amp"):
            out.append(f"--lora-experts: not modelled under autocast (--precision {self.precision}); use --precision "
                       "bf16 or fp16, or drop --lora-experts")
        elif self.lora_experts and self.lora_dropout != 0:
            out.append(f"--lora-experts: peft adapts fused expert weights without dropout; add --lora-dropout 0 "
                       f"(it is {self.lora_dropout!r})")
        out += self._data_problems()
        if spec is not None:
            out += self._model_problems(spec)
        return out

    def _data_problems(self) -> list[str]:
        """`--data`: a readable .txt or .jsonl file; `--data-mode` only with it."""
        if self.data is None:
            return [] if self.data_mode == "pad" else ["--data-mode: only applies to --data files; drop it or pass --data"]
        if not isinstance(self.data, str) or not self.data.strip():
            return [f"--data: expected a file name, got {self.data!r}"]
        p = Path(self.data)
        if p.is_dir():
            return [f"--data: {self.data!r} is a folder; pass a .txt (a sample per line) or .jsonl file"]
        if not p.is_file():
            return [f"--data: no such file {self.data!r}"]
        if p.suffix not in (".txt", ".jsonl"):
            return [f"--data: {self.data!r} must be a .txt (a sample per line) or .jsonl file"]
        if not os.access(p, os.R_OK):
            return [f"--data: {self.data!r} cannot be read (permission denied)"]
        return []

    def _model_problems(self, spec: Any) -> list[str]:
        unbuildable = spec.build_problem()
        if unbuildable:
            return [unbuildable]
        out: list[str] = []
        max_pos = spec.max_positions
        if max_pos is not None and isinstance(self.seq_len, int) and self.seq_len > max_pos:
            out.append(f"--seq-len: {self.seq_len} is longer than {spec.name}'s {max_pos} positions; "
                       f"use --seq-len {max_pos} or less")
        card = find_gpu(self.gpu) if self.gpu else None
        if card is not None and self.precision == "auto" and self.device != "cpu" and spec.stored_dtype == "bfloat16":
            out += [p.replace("--precision bf16", f"--precision auto (the {spec.name} checkpoint is bf16)")
                    for p in _card_problems(card, "bf16")]
        unknown = []  # targets naming no module of the model, or one peft refuses
        if self.peft in ("lora", "qlora") and self.lora_targets and self.lora_targets != ["all-linear"]:
            unknown = _target_problems(spec, self.lora_targets)
        out += unknown
        if self.peft in ("lora", "qlora") and _whole(self.lora_r) and 1 <= self.lora_r <= MAX_WHOLE:
            out += _rank_bound_problems(spec, self.lora_r, self.lora_targets)
        if self.peft in ("lora", "qlora") and self.lora_targets and not is_regex(self.lora_targets) and not unknown:
            out += _expert_conversion_problems(spec, self)
        if self.peft == "qlora" and spec.qlora_refusal:
            out.append(f"--peft qlora: {spec.name} cannot train with 4-bit weights: {spec.qlora_refusal}; use "
                       "--peft lora")
        if self.lora_experts is True and self.peft != "none" and not spec.expert_parameters:
            out.append(f"--lora-experts: {spec.name} has no fused expert weights (a mixture of experts' 3-D "
                       "experts parameters) to adapt; drop --lora-experts")
        if self.attention in FLASH_ATTENTIONS and not getattr(spec.model_class, "_supports_flash_attn", False):
            from transformers import __version__

            cls = getattr(spec.model_class, "__name__", spec.model_type)
            out.append(f"--attention: {spec.name} ({cls}) does not support {self.attention} in transformers "
                       f"{__version__}; use --attention {' or '.join(spec.attentions)}, or auto")
        elif (self.attention in FLASH_ATTENTIONS and self.precision == "auto" and self.device != "cpu"
              and spec.stored_dtype == "float32"):
            out.append(f"--attention {self.attention}: the {spec.name} checkpoint is fp32, which --precision auto "
                       "keeps, and flash-attn takes fp16/bf16 only; add --precision bf16 or amp-bf16")
        if self.attention in ("sdpa", "eager") and self.attention not in spec.attentions:
            from transformers import __version__

            cls = getattr(spec.model_class, "__name__", spec.model_type)
            out.append(f"--attention: {spec.name} ({cls}) does not support {self.attention} in transformers "
                       f"{__version__}; use --attention {' or '.join(spec.attentions)}, or auto")
        if self.kernels == "liger" and spec.model_type not in LIGER_FAMILIES:
            out.append(f"--kernels liger: trainmem models Liger's kernels for {', '.join(LIGER_FAMILIES)} models, and "
                       f"{spec.name} is {spec.model_type}; use --kernels none")
        if self.mamba_path == "kernels" and spec.model_type not in MAMBA_FAMILIES:
            out.append(f"--mamba-path kernels: {spec.name} ({spec.model_type}) has no Mamba mixer for it to change; "
                       "drop --mamba-path")
        if self.data is not None and spec.path is None:
            out.append(f"--data: {spec.name} has no tokenizer (a preset or a bare config.json); pass a "
                       "local model folder with tokenizer files as --model, or use the dummy data")
        return out

    def _node_problems(self) -> list[str]:
        """Problems of `--nodes`, `--gpus-per-node` and `--network`: `--gpus` is the world size and must be
        `nodes x gpus_per_node`."""
        out = [p for p in [network_problem(self.network)] if p]
        bad = [f for f, v in (("nodes", self.nodes), ("gpus-per-node", 1 if self.gpus_per_node is None else self.gpus_per_node))
               if not _whole(v) or not 1 <= v <= MAX_WHOLE]
        out += [f"--{f}: must be a whole number >= 1, got {getattr(self, f.replace('-', '_'))!r}" for f in bad]
        if bad or not _whole(self.gpus) or self.gpus < 1:
            return out
        if self.gpus_per_node is not None and self.gpus != self.nodes * self.gpus_per_node:
            out.append(f"--gpus {self.gpus}: the world size, but --nodes {self.nodes} x --gpus-per-node "
                       f"{self.gpus_per_node} is {self.nodes * self.gpus_per_node}; drop --gpus or make them agree")
        elif self.gpus % self.nodes:
            out.append(f"--nodes {self.nodes}: --gpus {self.gpus} (the world size) does not split evenly over "
                       f"{self.nodes} nodes; give --gpus-per-node N instead of --gpus")
        elif self.hsdp and self.per_node < 2:
            out.append(f"--nodes {self.nodes}: --shard fsdp over several nodes shards within a node (HSDP), and "
                       f"each node has {self.per_node} GPU; give --gpus-per-node 2 or more, or --shard ddp")
        return out

    def _rank_problems(self) -> list[str]:
        """Problems of `--rank`, each naming the flag and the fix."""
        if self.rank is None:
            return []
        out: list[str] = []
        zero = self.engine == "deepspeed" and str(self.shard).startswith("zero")
        if not _whole(self.gpus) or self.gpus < 2 or not (self.shard == "fsdp" or zero):
            out.append(f"--rank {self.rank}: emulates one rank of a sharded run; needs --gpus N (N >= 2) and "
                       "--shard fsdp, or --engine deepspeed --shard zero1|zero2|zero3")
        if not _whole(self.gpus):
            return out
        if self.rank != "all":
            try:
                r = int(self.rank)
            except (TypeError, ValueError):
                r = -1
            if not 0 <= r < max(self.gpus, 1):
                out.append(f"--rank {self.rank}: out of range for --gpus {self.gpus}; use 0..{self.gpus - 1} or all")
        return out

    def validate(self, spec: Any = None) -> TrainSetup:
        """Raise one SetupError listing every problem; else return this setup, with `spec` given resolved
        for it (`resolved`).

        Validating is done once: the setup returned remembers the spec it was checked against, so the
        next entry point it passes through (the CLI, then `run`, then `estimate`) does not check it
        again. The mark is not a field: `replace` makes a new setup, which is checked anew.
        """
        if spec is not None and getattr(self, "_checked_for", None) is spec:
            return self
        found = self.problems(spec)
        if found:
            raise SetupError(found)
        if spec is None:
            return self
        checked = self.resolved(spec)
        checked._checked_for = spec
        return checked

    def resolved(self, spec: Any) -> TrainSetup:
        """This setup with `attention: auto` made the kernel transformers picks for `spec`'s model, and, under
        LoRA with no `lora_targets` on a model peft has no default for, the targets trainmem picks
        (`default_lora_targets`), and `all-linear` on a model where peft refuses some Linears the others
        (`all_linear_targets`), so that the run, the estimate and the row all name them."""
        out = self.replace(attention=spec.attentions[0]) if self.attention == "auto" else self
        if out.peft in ("lora", "qlora") and not out.lora_targets:
            targets = default_lora_targets(spec)
            out = out.replace(lora_targets=targets) if targets else out
        elif out.peft in ("lora", "qlora") and out.lora_targets == ["all-linear"]:
            targets = all_linear_targets(spec)
            out = out.replace(lora_targets=targets) if targets else out
        return out


MAX_WHOLE = 2**31 - 1
"""The largest count a setup takes (batch, sequence, steps, rank, GPUs): the largest int32, beyond which tensor
sizes and process-group ranks overflow."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


ADAPTABLE = ("Linear", "Conv1D", "Embedding", "Conv1d", "Conv2d", "Conv3d", "MultiheadAttention")
"""Module kinds peft's LoRA can adapt (transformers' GPT-2 style Conv1D included); `ModelSpec.modules` gives
each module's kind, so that a subclass (Falcon's `FalconLinear`) counts as the class it extends."""

ATTENTION_PARTS = ("attn", "attention")
"""A module whose qualified name has a part containing one of these is in an attention block."""

TOWERS = re.compile(r"vision|visual|image|audio|vq|speech")
"""A module whose qualified name matches this is in a vision or audio tower, not the language model."""


def peft_refused(spec: Any) -> tuple[str, ...]:
    """The module names peft's LoRA refuses to adapt on this model, asked of peft's own check (tuners_utils
    `_check_lora_target_modules_mamba`, which raises when a module it would adapt has one of these names):
    `out_proj` and `conv1d`, a Mamba mixer's, on the model types peft lists (Falcon-H1, Mamba, Mamba-2,
    Falcon-Mamba, Nemotron-H in peft 0.21); none on the other hybrids (Jamba, Bamba, Zamba2, Granite-4.0-H),
    whose mixers peft adapts. Only names of the model's own adaptable modules are asked; sorted."""
    from types import SimpleNamespace

    try:
        from peft import LoraConfig
        from peft.tuners.tuners_utils import _check_lora_target_modules_mamba as check
    except ImportError:  # a peft without the check refuses nothing
        return ()
    config = LoraConfig(r=1)
    model = SimpleNamespace(config=SimpleNamespace(model_type=spec.built_model_type))
    refused = []
    for name in sorted({n.rsplit(".", 1)[-1] for n, kind in spec.modules.items() if kind in ADAPTABLE and n}):
        try:
            check(config, model, name)
        except ValueError:
            refused.append(name)
    return tuple(refused)


def default_lora_targets(spec: Any) -> list[str] | None:
    """LoRA targets for a model peft has no usable default for (None where it has one, and peft chooses): the
    Linear layers of its attention blocks, found by module kind and name (`q_proj`/`k_proj`/`v_proj`/`o_proj`,
    `qkv_proj`, `query_key_value`, `c_attn`, DeepSeek's MLA projections, ...), as peft's own defaults adapt
    attention; `all-linear` where the model has no such layer. The output head is never a target. A default that
    names no module of the model is not usable: peft's Mixtral default names the per-expert `w1`/`w2`/`w3`
    Linears, which transformers 5 fuses into 3-D expert weights. Refinements (`_pick`): a vision or audio tower's
    attention is left out, by one regex as peft's own Gemma-4 default does (Phi-4-multimodal); a Mamba mixer's
    `out_proj` and `conv1d`, which peft refuses, are left out, the other Linears named instead of `all-linear`
    (Mamba, Falcon-Mamba, Mamba-2); a name that also names a module LoRA cannot adapt is left out (Reformer's
    `feed_forward.dense`), as peft refuses the whole config for it."""
    return None if _peft_default_works(spec) else _pick(spec)[0]


def _pick(spec: Any) -> tuple[list[str], str]:
    """`default_lora_targets`' pick where peft has none, and what it is in words (for `lora_targets_note`)."""
    modules = spec.modules
    attention = [n for n in _linears(spec)
                 if any(w in part.lower() for part in n.split(".")[:-1] for w in ATTENTION_PARTS)]
    towers = [n for n in attention if TOWERS.search(n)]
    names = {n.rsplit(".", 1)[-1] for n in attention if n not in towers}
    what = "the Linear layers of its attention blocks"
    if not names and peft_refused(spec):  # a Mamba model: its Linears but those peft refuses, named
        names, what = _all_linear_names(spec), f"every Linear layer but the output head and {_refused_words(spec)}"
    names -= {n.rsplit(".", 1)[-1] for n, kind in modules.items() if kind not in ADAPTABLE}
    if not names:
        return ["all-linear"], "every Linear layer but the output head (it has no attention projections)"
    if towers:  # one regex, matched against whole module names, that keeps the towers out
        return ([rf"^(?!.*({TOWERS.pattern})).*\.({'|'.join(sorted(names))})$"],
                f"{what} outside its vision and audio towers (a regex)")
    return sorted(names), what


def _linears(spec: Any) -> list[str]:
    """The modules `all-linear` adapts: every Linear (and GPT-2's Conv1D) but the output head."""
    return [n for n, kind in spec.modules.items()
            if kind in ("Linear", "Conv1D") and "lora_" not in n and n and n != spec.output_embedding]


def _all_linear_names(spec: Any) -> set[str]:
    """The names of `_linears` but those peft refuses on the model and those that also name a module LoRA cannot
    adapt."""
    names = {n.rsplit(".", 1)[-1] for n in _linears(spec)} - set(peft_refused(spec))
    return names - {n.rsplit(".", 1)[-1] for n, kind in spec.modules.items() if kind not in ADAPTABLE}


def _refused_words(spec: Any) -> str:
    """The Linears' names peft refuses on the model, in words."""
    linear = {n.rsplit(".", 1)[-1] for n in _linears(spec)}
    names = " and ".join(n for n in peft_refused(spec) if n in linear)
    return f"{names}, which peft refuses on {spec.built_model_type} models"


def all_linear_targets(spec: Any) -> list[str] | None:
    """What `all-linear` becomes on a model where peft would adapt a Linear it then refuses (a Mamba mixer's
    `out_proj` on Falcon-H1, Mamba, Nemotron-H): every other Linear's name, so that `all-linear` never fails;
    None where peft takes `all-linear` as it is."""
    if not set(peft_refused(spec)) & {n.rsplit(".", 1)[-1] for n in _linears(spec)}:
        return None
    return sorted(_all_linear_names(spec)) or None


def is_regex(targets: list[str] | None) -> bool:
    """Whether `targets` is one regular expression (a single entry beginning with `^`), which peft takes as a
    string and matches against whole module names, rather than a list of names."""
    return bool(targets) and len(targets) == 1 and targets[0].startswith("^")


def peft_targets(targets: list[str] | None) -> str | list[str] | None:
    """`target_modules` as peft takes it: the string `all-linear` or a regex, else the list of names."""
    return targets[0] if targets == ["all-linear"] or is_regex(targets) else targets


def _targeted(name: str, targets: list[str]) -> bool:
    """Whether peft adapts the module `name` under `targets`: a regex matches the whole name, a name matches it
    or its last dotted parts."""
    if is_regex(targets):
        return re.fullmatch(targets[0], name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


_PEFT_DEFAULT: dict[str, bool] = {}


def _peft_default_works(spec: Any) -> bool:
    """Whether peft's own default targets adapt something in this model: asked of peft itself, on the model
    built on the meta device (no memory), once per model config."""
    key = f"{spec.name}:{sorted(spec.config.items())!r}"
    if key not in _PEFT_DEFAULT:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        from torch.utils._python_dispatch import _disable_current_modes

        # outside any dispatch mode: asked from inside a simulation, the probe's tensors are not the step's
        with _disable_current_modes(), torch.device("meta"):
            model = AutoModelForCausalLM.from_config(spec.hf_config())
            try:
                get_peft_model(model, LoraConfig(r=1, task_type="CAUSAL_LM"))
                _PEFT_DEFAULT[key] = True
            except ValueError:  # no default for the model type, or one naming no module of it
                _PEFT_DEFAULT[key] = False
    return _PEFT_DEFAULT[key]


def lora_targets_note(spec: Any, setup: TrainSetup) -> str | None:
    """Says which LoRA targets trainmem picked where peft has no default for the model, or what `all-linear`
    became where peft refuses some of the model's Linears, and how to choose."""
    if setup.peft == "none" or not setup.lora_targets:
        return None
    if setup.lora_targets != default_lora_targets(spec):
        if setup.lora_targets != all_linear_targets(spec):
            return None
        return (f"LoRA targets: all-linear names every Linear layer but the output head and "
                f"{_refused_words(spec)}: {', '.join(setup.lora_targets)}")
    what = _pick(spec)[1]
    return (f"LoRA targets: peft has no default for {spec.model_type} models that names their layers; adapting {what}: "
            f"{', '.join(setup.lora_targets)} (--lora-targets chooses others)")


def _target_problems(spec: Any, targets: list[str]) -> list[str]:
    """`--lora-targets` that name no adaptable module of the model, or a module peft refuses on it
    (`peft_refused`), found from its config before anything is built. peft matches a target against a module's
    whole name or its last dotted parts."""
    modules = spec.modules
    refused = peft_refused(spec)
    adaptable = sorted({n.rsplit(".", 1)[-1] for n, cls in modules.items() if cls in ADAPTABLE and n} - set(refused))
    out = []
    missing = [t for t in targets if not any(_targeted(n, [t]) and cls in ADAPTABLE for n, cls in modules.items())]
    if missing:
        none_left = len(missing) == len(targets)
        out.append(f"--lora-targets: {spec.name} has no adaptable module named {', '.join(map(repr, missing))}"
                   + ("; the model would have no trainable parameters" if none_left else "")
                   + f"; its layers that LoRA can adapt: {', '.join(adaptable)} (or all-linear)")
    hits = {t: sorted({n.rsplit(".", 1)[-1] for n, cls in modules.items()
                       if cls in ADAPTABLE and n.rsplit(".", 1)[-1] in refused and _targeted(n, [t])})
            for t in ([targets[0]] if is_regex(targets) else targets)}
    hit = sorted({name for names in hits.values() for name in names})
    if hit:  # peft's get_peft_model raises on the first of them
        fix = (f"make the regex match no {' or '.join(hit)}" if is_regex(targets)
               else f"drop {' and '.join(t for t, names in hits.items() if names)}")
        out.append(f"--lora-targets: peft refuses LoRA on {' and '.join(hit)} in {spec.built_model_type} models (it "
                   f"refuses {' and '.join(refused)}, the Mamba mixers' layers); {fix}, or use all-linear, which "
                   "leaves them out")
    return out


def _expert_conversion_problems(spec: Any, setup: TrainSetup) -> list[str]:
    """Targets that peft turns into the fused expert weights of a mixture of experts: peft converts the
    transformers-4 names of an expert's projections (`gate_proj`, `up_proj`, `down_proj`, Mixtral's `w1`..`w3`,
    the router's `gate`; every one under `all-linear`) into `target_parameters` on the model types whose
    experts transformers 5 fuses, and adapts those (peft's `ParamWrapper`) without dropout, and not one half of a
    fused pair. Asked of peft's own conversion (`convert_peft_config_for_transformers`), on the model's meta copy
    (peft 0.22 reads its modules: a name that matches real Linear layers stays a module target)."""
    try:
        from peft import LoraConfig
        from peft.utils.transformers_weight_conversion import (
            _MODEL_TO_CONVERSION_PATTERN as patterns,
        )
        from peft.utils.transformers_weight_conversion import (
            _MOE_TARGET_MODULE_MAPPING as renamed,
        )
        from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers as convert
    except ImportError:  # a peft without the conversion converts nothing
        return []
    old = renamed.get(patterns.get(spec.built_model_type), {})  # an expert's old name -> its fused parameter
    names = setup.lora_targets
    if names == ["all-linear"]:  # what peft resolves it to: every Linear's name and every old name
        names = sorted({n.rsplit(".", 1)[-1] for n in _linears(spec)} | set(old))
    config = LoraConfig(r=1, target_modules=names)
    flag = f"--lora-targets {','.join(setup.lora_targets)}"
    if not old:  # no expert of this model type is converted
        return []
    try:
        convert(config, _meta_copy(spec), None)
    except ValueError as e:  # one half of a fused pair named
        return [f"{flag}: {e} (peft converts them on {spec.built_model_type} models); name both"]
    experts = sorted(config.target_parameters or ())
    if not experts or setup.lora_experts is True:  # --lora-experts has the same rules, under its own flag
        return []
    what = (f"{flag}: on {spec.built_model_type} models peft turns {', '.join(sorted(set(names) & set(old)))} into "
            f"the fused expert weights {', '.join(experts)} and adapts those")
    if setup.lora_dropout != 0:
        return [f"{what} without dropout; add --lora-dropout 0 (it is {setup.lora_dropout!r})"]
    if str(setup.precision).startswith("amp"):
        return [f"{what}, not modelled under autocast (--precision {setup.precision}); use --precision bf16 or fp16"]
    return []


_META_COPIES: dict[str, Any] = {}
"""`_meta_copy` by config: validation runs once per card of the every-card table."""


def _meta_copy(spec: Any) -> Any:
    """The spec's model on the meta device, built once per config (the last few kept)."""
    import json

    key = json.dumps(spec.config, sort_keys=True, default=str)
    if key not in _META_COPIES:
        _META_COPIES[key] = spec.meta_model()
        while len(_META_COPIES) > 4:
            del _META_COPIES[next(iter(_META_COPIES))]
    return _META_COPIES[key]


def _rank_bound_problems(spec: Any, r: int, targets: list[str] | None) -> list[str]:
    """`--lora-r` above the smallest dimension of a layer it adapts: a rank-r product A @ B of that layer's
    shape has rank min(rows, cols) at most, so a larger r only adds parameters. The layers are the targets
    given, else those trainmem or peft picks for the architecture (`default_lora_targets`), else every Linear
    (as `all-linear`)."""
    from peft.utils.constants import (
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults,
    )

    names = targets or default_lora_targets(spec) or defaults.get(spec.model_type)
    names = all_linear_targets(spec) if names == ["all-linear"] else names
    shapes = {n: shape for n, shape in spec.weight_shapes.items() if spec.modules.get(n) in ADAPTABLE}
    if names:
        adapted = {n: shape for n, shape in shapes.items() if _targeted(n, names)}
    else:
        adapted = {n: shape for n, shape in shapes.items()
                   if spec.modules[n] in ("Linear", "Conv1D") and n != spec.output_embedding}
    if not adapted:
        return []
    name, shape = min(adapted.items(), key=lambda item: min(item[1]))
    if r <= min(shape):
        return []
    return [f"--lora-r: {r} is more than the smallest dimension of the layers it adapts ({min(shape)}: "
            f"{name} is {' x '.join(map(str, shape))}); a rank above it only adds parameters: use "
            f"--lora-r {min(shape)} or less"]


def _card_problems(card: Any, precision: str) -> list[str]:
    """bf16 on a card without native bf16 (sm70, sm75) fails at the first kernel that needs it."""
    if card.bf16 or precision not in ("bf16", "amp-bf16"):
        return []
    return [f"--precision {precision}: the {card.name} (sm{card.sm[0]}{card.sm[1]}, {card.architecture}) has no "
            "native bf16; use --precision amp-fp16 (fp32 weights, fp16 autocast with a gradient scaler)"]


def _flash_card_problems(card: Any, attention: str, name: str) -> list[str]:
    """flash-attn's kernels on a card they do not run on (`flash_attention_problem`)."""
    why = flash_attention_problem(attention, card.sm)
    if why is None:
        return []
    return [f"--attention {attention}: {why}, and --gpu {name} is the {card.name} (sm{card.sm[0]}{card.sm[1]}); use "
            f"--attention sdpa" + (" or flash_attention_2" if attention == "flash_attention_3" and card.sm >= (8, 0)
                                   else "") + ", or another --gpu"]


def training_arguments_values(args: Any, model: Any = None) -> dict[str, Any]:
    """The TrainSetup fields that a `TrainingArguments` (an object or any namespace with its field
    names) and optionally its model determine; the rest stays at the defaults or the caller's layers.

    Autocast comes from `bf16`/`fp16`; without it the model's dtype is the precision (`auto` without
    a model). LoRA settings, checkpointing and attention come from the model when given.
    """
    amp = "amp-bf16" if getattr(args, "bf16", False) else "amp-fp16" if getattr(args, "fp16", False) else None
    optim = getattr(args, "optim", "adamw_torch")
    optim = str(getattr(optim, "value", optim))
    values: dict[str, Any] = dict(
        batch_size=int(args.per_device_train_batch_size),
        grad_accum=int(args.gradient_accumulation_steps),
        checkpointing=bool(args.gradient_checkpointing),
        precision=amp or "auto",
        optimizer=by_trainer_name(optim),  # an unknown name is reported by validation as --optimizer
        lr=float(args.learning_rate),
        seed=int(args.seed),
    )
    if getattr(args, "use_liger_kernel", False):
        values["kernels"] = "liger"
    if int(getattr(args, "max_steps", -1) or -1) > 0:
        values["steps"] = int(args.max_steps)
    if model is not None:
        values.update(_model_values(model, amp))
    return values


def _model_values(model: Any, amp: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    param = next(model.parameters(), None)
    if amp is None and param is not None:
        out["precision"] = {"float16": "fp16", "bfloat16": "bf16"}.get(str(param.dtype).replace("torch.", ""), "fp32")
    if getattr(model, "is_gradient_checkpointing", False):
        out["checkpointing"] = True
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attn in ATTENTIONS:
        out["attention"] = attn
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        cfg = next(iter(peft_config.values()))
        targets = cfg.target_modules
        out.update(peft="qlora" if getattr(model, "is_loaded_in_4bit", False) else "lora", lora_r=int(cfg.r),
                   lora_alpha=int(cfg.lora_alpha), lora_dropout=float(cfg.lora_dropout),
                   lora_targets=sorted(targets) if isinstance(targets, (set, list, tuple)) else None)
    return out


def from_training_arguments(args: Any, model: Any = None, **overrides: Any) -> TrainSetup:
    """A TrainSetup from a transformers `TrainingArguments` (the seed builds one), and its model if given."""
    setup = TrainSetup(**training_arguments_values(args, model))
    return setup.replace(**overrides) if overrides else setup


__all__ = ["TrainSetup", "from_training_arguments", "default_lora_targets", "all_linear_targets", "peft_refused",
           "lora_targets_note", "training_arguments_values", "ENGINES", "PEFTS", "PRECISIONS", "OPTIMIZERS",
           "ATTENTIONS", "is_regex", "peft_targets"]
