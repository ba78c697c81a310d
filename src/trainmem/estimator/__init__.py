"""Predict the memory of a fine-tuning setup on a CUDA GPU, with no GPU.

    >>> import trainmem
    >>> b = trainmem.estimate("polyglot-ko-1.3b", trainmem.TrainSetup(batch_size=4, precision="fp16"))
    >>> b.fits("T4"), b.peak_phase
    (True, 'optimizer step')

Two methods, the same breakdown (`memory` keys of a measurement):
- `analytic`: closed-form terms (see `analytic.py`, `states.py`), milliseconds per setup once the
  model's parameter inventory is built;
- `simulate`: the real model's step on the meta device under trainmem's tensor ledger (`simulate.py`).
`auto` simulates every single-GPU setup and FSDP2 (`--gpus N --shard fsdp`, `sharded.py`); DDP, ZeRO and
offload use the analytic method (ZeRO's closed forms checked against DeepSpeed ranks measured on one GPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import ESTIMATORS, TrainSetup, lora_targets_note
from trainmem.config.specs import ModelSpec
from trainmem.forked import at_once
from trainmem.hardware import cuda
from trainmem.hardware.gpus import CATALOG, GPU, find_gpu
from trainmem.version import stamp

from .breakdown import ADVICE, Breakdown
from .memory import allocator, analytic, compose, runtime, sharded, sharding, states, trlhead, zero
from .memory.simulate import model_builder, simulate_step, steady_start
from .memory.hostvalues import ROUTING_BALANCED, ROUTING_FREE, UnknownValue
from .time import comm
from .time import step as timing

METHODS = ESTIMATORS
MAMBA_NOTES = {
    "torch": "priced: the PyTorch Mamba path (transformers' chunked scan, which runs where mamba-ssm is not installed)",
    "kernels": "priced: the mamba-ssm kernels path (mamba-ssm and causal-conv1d installed; derived from their "
               "sources, not measured)",
}
"""The note that says which Mamba path a hybrid's estimate prices (`TrainSetup.mamba_path`); the answer shows it
first, with the other path's figure (`search.advice.other_mamba_path`)."""


class EstimateError(RuntimeError):
    """A model neither method can estimate: the one line says why (the CLI prints it, exit 1)."""


def _sm_kernels(setup: TrainSetup) -> str | None:
    """The kernels of `setup` whose simulated memory depends on the card's SM count (Liger's RMSNorm keeps a partial
    row per SM, the Mamba kernels and flash-attn split their work by it): their flag and why, else None."""
    if setup.kernels == "liger":
        return "--kernels liger (Liger's kernels are priced by simulating the step)"
    if setup.mamba_path == "kernels":
        return "--mamba-path kernels (the Mamba kernels are priced by simulating the step)"
    if setup.attention in cuda.FLASH_ATTENTIONS:
        return f"--attention {setup.attention} (flash-attn's kernels are priced by simulating the step)"
    return None


def simulated_only(setup: TrainSetup) -> str | None:
    """What of `setup` only the simulate method prices (its flag and value, and why), else None: kernels whose
    memory the simulated step's stand-ins allocate."""
    if setup.engine == "sft" and not setup.distributed and not _sm_kernels(setup):
        return "--engine sft (TRL's fused LM head is priced by simulating the step)"
    return _sm_kernels(setup)


def reads_sms(setup: TrainSetup) -> bool:
    """Whether the simulated step depends on the card's SM count (`_sm_kernels`; TRL's head does not)."""
    return _sm_kernels(setup) is not None


def estimate(spec: ModelSpec | str, setup: TrainSetup | None = None, method: str = "auto", *,
             step: Any = None) -> Breakdown:
    """The memory breakdown of `setup` on one CUDA GPU. Raises SetupError for bad input.

    `step`: the ledger of this setup's simulated step (`simulated_step`) made for another card of the same
    runtime (cuBLAS workspace, flash kernel): cards that differ only in their capacity share one simulated
    step, each replayed under its own cap (the every-card table of `search.cards`)."""
    from trainmem.errors import SetupError

    spec = ModelSpec.resolve(spec) if isinstance(spec, str) else spec
    setup = (setup or TrainSetup()).validate(spec)
    if method not in METHODS:
        raise SetupError([f"--method: {method!r} is not one of {', '.join(METHODS)}"])
    if method == "analytic" and (why := simulated_only(setup)):
        raise SetupError([f"--method analytic: does not model {why}; use --method simulate or auto"])
    precision = setup.resolved_precision(spec, "cuda")
    method, why = _method(setup, method)
    notes = _setup_notes(spec, setup, why)
    runtime_card = _runtime_card(setup)
    card = runtime_card if setup.gpu else None
    notes += _card_notes(card)
    paged = OPTIMIZERS[setup.optimizer].paged
    if paged:
        notes.append("paged optimizer states live in CUDA managed memory: outside peak_allocated, inside device_used")
    inv = states.inventory(spec, setup, precision)
    model_states = _model_states(inv, setup)
    memory, phase, terms, reserved, method = _memory(spec, setup, precision, inv, model_states, method, notes,
                                                     runtime_card, step, compare=card is not None and not paged)
    if setup.engine == "sft":
        notes.append(trlhead.NOTE if method == "simulate" else trlhead.ANALYTIC_NOTE)
    if _grouped_experts(inv) and ROUTING_BALANCED not in notes:
        notes.append(ROUTING_FREE)
    if paged:
        memory["peak_allocated"] -= memory["optimizer"]
        memory["optimizer"] = 0
    # simulate replays its allocations through the caching allocator's policy; analytic has no event
    # order to replay and takes the measured median gap
    memory["peak_reserved"] = reserved if reserved is not None else int(memory["peak_allocated"] * _reserved_ratio(setup))
    overhead = runtime_card.overhead(setup.attention, precision, setup.peft)
    memory["device_used"] = memory["peak_reserved"] + overhead + (model_states["optimizer"] if paged else 0)
    model_states = _per_gpu(inv, setup, precision, model_states)
    if setup.shard.startswith("zero"):  # DeepSpeed's step sets every gradient to None (stage_1_and_2.py, stage3.py)
        model_states["gradients"] = 0
    terms.update(_weight_terms(inv, setup, model_states, notes))
    time = _time(spec, inv, setup, precision, runtime_card, notes)
    installed = runtime.versions()
    if runtime.version_note(installed):
        notes.append(runtime.version_note(installed))
    env = {**installed, **stamp(), "validated_on": dict(runtime.VALIDATED_ON)}
    model = {**spec.describe(), "trainable_parameters": sum(p.numel for p in inv.params if p.trainable)}
    resolved = setup.replace(device="cuda", precision=precision)
    return Breakdown(method, memory, model_states, phase, resolved.to_dict(), model, overhead,
                     terms, tuple(notes), env, time)


def states_floor(spec: ModelSpec | str, setup: TrainSetup, gpu: str | GPU) -> int:
    """A lower bound of what `setup` needs on `gpu` (the verdict's `need`), from the model's inventory alone, without
    simulating a step: the weights, gradients and optimizer states one GPU holds (all live at once in the first
    optimizer step; paged states live outside the allocator) plus the card's memory outside the allocator. Where it
    exceeds the card, the setup does not fit whatever its activations: the checked advice says so without the
    estimate, which for a large model simulated whole costs half a minute."""
    spec = ModelSpec.resolve(spec) if isinstance(spec, str) else spec
    setup = setup.validate(spec)
    card = gpu if isinstance(gpu, GPU) else find_gpu(gpu)
    precision = setup.resolved_precision(spec, "cuda")
    inv = states.inventory(spec, setup, precision)
    ms = _per_gpu(inv, setup, precision, _model_states(inv, setup))
    held = ms["weights"] + ms["gradients"] + (0 if OPTIMIZERS[setup.optimizer].paged else ms["optimizer"])
    return held + card.overhead(setup.attention, precision, setup.peft)


def _model_states(inv: states.Inventory, setup: TrainSetup) -> dict[str, int]:
    """The weights, gradients and optimizer states of the whole model on one GPU."""
    return {"weights": states.weights(inv), "gradients": states.gradients(inv),
            "optimizer": states.optimizer(inv, setup.optimizer)}


def _per_gpu(inv: states.Inventory, setup: TrainSetup, precision: str, ms: dict[str, int]) -> dict[str, int]:
    """The states one GPU holds: a rank's share under sharding, as a measured rank reports them, else `ms`."""
    if not setup.distributed:
        return ms
    rank = _rank_states(inv, setup, precision, ms)
    return {"weights": rank.weights, "gradients": rank.gradients, "optimizer": rank.optimizer}


def _setup_notes(spec: ModelSpec, setup: TrainSetup, method_note: str | None) -> list[str]:
    """What the answer should say about the setup itself: LoRA targets chosen for the user, attention that fell
    back to eager, why the method is not the one asked for (`_method`), the GPUs, `--data` priced as full
    rows, a learning rate tuned for another batch."""
    notes: list[str] = [n for n in [lora_targets_note(spec, setup)] if n]
    if "sdpa" not in spec.attentions:  # auto became eager (explicit sdpa is refused by validate)
        from transformers import __version__

        notes.append(f"eager attention: {getattr(spec.model_class, '__name__', spec.name)} does not support SDPA "
                     f"in transformers {__version__}")
    if method_note:
        notes.append(method_note)
    if setup.distributed:
        notes.append(f"per GPU, {setup.gpus} GPUs with {setup.shard}"
                     + (f" (HSDP: each rank holds the FSDP rank of a {setup.shard_group}-GPU node's shard)"
                        if setup.hsdp else "")
                     + (f", {setup.offload} offloaded" if setup.offload != "none" else ""))
    if setup.kernels == "liger":
        kernels = ("RMSNorm, SwiGLU and RoPE (TRL's SFTTrainer turns Liger's fused cross-entropy off for its own "
                   "head)" if setup.engine == "sft" else "fused linear cross-entropy (no logits), RMSNorm, SwiGLU and RoPE")
        notes.append(f"--kernels liger: Liger's {kernels} "
                     f"priced from liger-kernel {cuda.LIGER_VERSION}'s sources; the step time is transformers' "
                     "modules', not Liger's kernels'")
    if spec.model_type in cuda.MAMBA_FAMILIES:
        notes.append(MAMBA_NOTES[setup.mamba_path])
    if setup.attention in cuda.FLASH_ATTENTIONS:
        notes.append(f"priced: --attention {setup.attention} from flash-attn {cuda.FLASH_ATTN_VERSION}'s sources "
                     "(derived, not measured: the package cannot be installed where trainmem was validated); its "
                     "step time is SDPA's flash kernel's")
    if setup.data is not None:
        notes.append(f"--data: estimated as full {setup.seq_len}-token rows (an upper bound for padded text)")
    if setup.lr_note():
        notes.append(setup.lr_note())
    return notes


def _method(setup: TrainSetup, method: str) -> tuple[str, str | None]:
    """`analytic` or `simulate`, and a note where that is not what was asked for: `auto` simulates every
    single-GPU setup and FSDP2's rank 0; the other sharding strategies and offload have the analytic method only."""
    if setup.distributed:
        if sharded.simulates(setup) and method != "analytic":
            return "simulate", None  # rank 0's FSDP2 step under the fake process group (sharded.py)
        return "analytic", (f"--shard {setup.shard}" + (f" --offload {setup.offload}" if setup.offload != "none"
                                                        else "")
                            + ": modelled by the analytic method only, "
                            + (ZERO_CHECKED if setup.shard.startswith("zero") else "unvalidated against measured runs")
                            + (" (simulate was asked for: used analytic instead)" if method == "simulate" else ""))
    return ("simulate" if method == "auto" else method), None


ZERO_CHECKED = ("closed forms; on ten DeepSpeed ZeRO ranks measured on one H100 and held out, peak_allocated median "
                "error 8%, worst -35%, peak_reserved median 11%, worst -47% (ZeRO-2 with optimizer offload), half under")
"""What a ZeRO rank's answer says of its figures (docs/lab/zero-held-out-2026-12-06.md)."""


def _card_notes(card: GPU | None) -> list[str]:
    """Where the card's runtime figures are derived rather than measured, which ones."""
    if card is None or card.measured:
        return []
    return [f"{card.name}: runtime figures derived from the H200 measurement (docs/cards.md): "
            f"{card.cublas_workspace / 2**20:.3g} MiB cuBLAS workspace per handle, "
            f"{card.context / 2**20:.0f} MiB outside the allocator"
            + ("" if card.flash else ", memory-efficient SDPA instead of flash (no flash kernel before sm80)")]


def _memory(spec: ModelSpec, setup: TrainSetup, precision: str, inv: states.Inventory, model_states: dict[str, int],
            method: str, notes: list[str], card: GPU, step: Any,
            compare: bool) -> tuple[dict[str, int], str, dict[str, int], int | None, str]:
    """The step's memory by `method`, falling back to the other where one cannot run this model: (memory, peak
    phase, terms, peak reserved where the allocator was replayed, the method used). `compare`: also price
    the analytic method's reserved bytes beside a simulation, so that the verdict can say where they differ."""
    if method == "analytic":
        try:
            analytic.Traits.of(inv.model)
        except ValueError as e:
            notes.append(f"the analytic method does not know {spec.name}'s modules ({e}): simulated instead")
            method = "simulate"
    if method == "simulate":
        try:
            if zero.simulates(setup):
                return (*_zero(spec, inv, setup, precision, model_states, notes, card, step), method)
            memory, phase, terms, reserved = _simulate(spec, setup, precision, notes, card, step)
        except (UnknownValue, NotImplementedError) as e:  # the meta device cannot run this model's step
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            notes.append(f"the simulate method cannot run {spec.name}'s step on the meta device ({first}): "
                         "estimated by the analytic method instead, which models fewer of CUDA's allocations")
            try:
                analytic.Traits.of(inv.model)
            except ValueError as missing:
                raise EstimateError(f"{spec.name}: neither method can estimate it: {first}; and the analytic "
                                    f"method does not know its modules ({missing})") from None
        else:
            if compare:
                other = _analytic_reserved(inv, setup, precision, model_states, card)
                if other is not None:
                    terms["analytic_reserved"] = other
            return memory, phase, terms, reserved, method
    memory, phase, terms = _analytic(inv, setup, precision, model_states, notes, card)
    return memory, phase, terms, None, "analytic"


def _weight_terms(inv: states.Inventory, setup: TrainSetup, model_states: dict[str, int],
                  notes: list[str]) -> dict[str, int]:
    """The weights' parts the breakdown shows apart: a mixture of experts' expert weights, and QLoRA's weights
    that stay unquantized where they are most of them (with the note that says what to do instead)."""
    terms: dict[str, int] = {}
    experts = sum(int(p.numel * p.bytes_per) for p in inv.params if ".experts." in f".{p.name}")
    if experts and not setup.distributed:  # the weights' share of a mixture of experts
        terms["expert_weights"] = experts
    if setup.peft == "qlora":
        left = _unquantized(inv)
        if left and left[0] * 2 > model_states["weights"]:
            terms["unquantized_weights"] = left[0]
            notes.append(f"QLoRA: {left[0] / 2**30:.2f} GiB of the {model_states['weights'] / 2**30:.2f} GiB of "
                         f"weights are not 4-bit ({left[1]}): bitsandbytes quantizes only nn.Linear and Conv1D "
                         "layers, and peft's prepare_model_for_kbit_training casts the others to fp32; --peft "
                         "lora in bf16 holds them in half the bytes")
    return terms


def _time(spec: ModelSpec, inv: states.Inventory, setup: TrainSetup, precision: str, card: GPU,
          notes: list[str]) -> dict[str, Any] | None:
    """The predicted step time on `card` (`timing.py`), saying where it is derived rather than measured."""
    try:
        work = timing.workload(spec, inv, setup, precision, card)
        step = timing.step_time(work, card)
    except ValueError as e:  # no decoder-layer list to count
        notes.append(f"no step time: {e}")
        return None
    if step is None:
        notes.append(f"no step time: the catalog has no speed figures for the {card.name}")
        return None
    out = step.to_dict()
    _add_comm(out, step, work, inv, setup, precision, card, notes)
    out["tokens_per_s"] *= setup.gpus
    if step.derived:
        notes.append(f"time: derived from the {card.name}'s datasheet figures with efficiencies fitted on H200 "
                     "runs (docs/time-model.md); not measured on this card")
    unaligned = _unaligned_note(spec, work, card, step.step_s)
    if unaligned:
        notes.append(unaligned)
    return out


def _add_comm(out: dict[str, Any], step: timing.StepTime, work: timing.Workload,
              inv: states.Inventory, setup: TrainSetup, precision: str, card: GPU, notes: list[str]) -> None:
    """Add the exposed communication of a rank of several (`comm.py`) to the step time in `out`, and say so."""
    f = work.flops
    matmul = (f["forward"] + f["backward"] + f["recompute"]) or 1.0
    forward_s = step.micro_s * f["forward"] / matmul
    c = comm.comm_time(setup, inv, precision, card, forward_s, step.micro_s - forward_s)
    if c is None:
        if setup.gpus > 1:
            notes.append(f"time: per GPU; the catalog has no link figures for the {card.name}, so communication "
                         "between GPUs is not in it")
        return
    out["comm"] = c.to_dict()
    out["parts"]["comm"] = c.exposed_s
    out["mfu"] *= step.step_s / (step.step_s + c.exposed_s)
    out["step_s"] = step.step_s + c.exposed_s
    out["tokens_per_s"] = work.tokens / out["step_s"]
    layout = (f"HSDP: sharded over {setup.per_node} GPUs a node, replicated over {setup.nodes} nodes"
              if setup.hsdp else f"{setup.gpus} GPUs" + (f" on {setup.nodes} nodes" if setup.nodes > 1 else ""))
    notes.append(f"time: per GPU, with {c.exposed_s:.3g} s a step of exposed communication ({layout}; "
                 f"{c.total_s:.3g} s of collectives in all, over {' and '.join(c.links)}; {comm.DERIVED}; "
                 "docs/guide/several-gpus.md)")


def _unaligned_note(spec: ModelSpec, work: timing.Workload, card: GPU, step_s: float) -> str | None:
    """Where half-precision products with a dimension not a multiple of 8 cost the step 2% or more (GPT-2's
    50257-token head, a vocabulary grown by an added token), what padding them would save."""
    if not work.flops.get("unaligned"):
        return None
    aligned = timing.step_time(dataclasses.replace(work, flops={**work.flops, "unaligned": 0.0}), card)
    saved = 1 - aligned.step_s / step_s
    if saved < 0.02:
        return None
    vocab = int(getattr(spec.text_config(), "vocab_size", 0) or 0)
    what = (f"the output head's {vocab} tokens are not a multiple of 8: padding the vocabulary "
            "(model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8))" if vocab % 8 else
            "some matmul dimensions are not multiples of 8: padding them")
    return (f"time: {what} is predicted to make the step {saved:.0%} faster (half-precision tensor-core "
            "kernels want multiples of 8; docs/time-model.md)")


def _analytic_reserved(inv: states.Inventory, setup: TrainSetup, precision: str, ms: dict[str, int],
                       card: GPU) -> int | None:
    """The analytic method's peak reserved bytes, or None where it does not know the model's modules."""
    try:
        memory, _, _ = _analytic(inv, setup, precision, ms, [], card)
    except ValueError:
        return None
    return int(memory["peak_allocated"] * _reserved_ratio(setup))


def _reserved_ratio(setup: TrainSetup) -> float:
    """The analytic method's peak reserved over peak allocated: DeepSpeed ZeRO's own where a ZeRO rank is asked."""
    return runtime.DEEPSPEED_RESERVED_OVER_ALLOCATED if setup.shard.startswith("zero") else runtime.RESERVED_OVER_ALLOCATED


def _rank_states(inv: states.Inventory, setup: TrainSetup, precision: str,
                 ms: dict[str, int]) -> sharding.RankStates:
    """Per GPU under sharding (one GPU: the states themselves); foreach AdamW copies the local gradients.
    FSDP2 under amp-* gathers each layer in half precision (MixedPrecisionPolicy.param_dtype, fake_group.py)."""
    trainable = sum(p.numel for p in inv.params if p.trainable)
    gathered = _largest_layer(inv) // (2 if precision.startswith("amp") and setup.shard == "fsdp" else 1)
    total = sum(p.numel for p in inv.params)
    live = ms["weights"] * min(sharding.ZERO3_MAX_LIVE, total) // max(total, 1)
    sizes = [int(p.numel * p.bytes_per) for p in inv.params if p.trainable]
    return sharding.rank_states(ms["weights"], ms["gradients"], ms["optimizer"], trainable,
                                precision in ("fp16", "bf16"), setup.shard_group, setup.shard, setup.offload,
                                gathered, foreach_copy=OPTIMIZERS[setup.optimizer].foreach,
                                unsharded_optimizer=_step_scalars(inv, setup.optimizer), zero3_live=live,
                                largest_param=max(sizes, default=0), trainable_bytes=sum(sizes))


def _rank_notes(rank: sharding.RankStates, setup: TrainSetup, terms: dict[str, int], notes: list[str]) -> None:
    """What a rank's states say of themselves, and the host RAM its offloaded states take."""
    notes.extend(rank.notes)
    if rank.host:
        per_node = setup.gpus // setup.nodes
        terms["host_memory_per_rank"] = rank.host
        notes.append(f"--offload {setup.offload}: each rank keeps {rank.host / 2**30:.1f} GiB in host RAM, "
                     f"{per_node * rank.host / 2**30:.1f} GiB for the {per_node} ranks of a node (states only: "
                     "pinned staging buffers and the framework's own RAM come on top)")


ZERO_SIMULATED = ("ZeRO-1/2: the rank's forward and backward simulated as one GPU's (a stage-1/2 rank runs them "
                  "unsharded), its states from DeepSpeed's partitioning; on two held-out sets of ten DeepSpeed ranks "
                  "measured on one H100, peak_allocated median error 0.03% and 0.02%, worst -2% and +8.2% (ZeRO-1 "
                  "with accumulation)")
"""What a ZeRO-1/2 rank's answer says of its allocated bytes (docs/lab/zero-optimizer-step-2026-12-07.md)."""
ZERO_REPLAYED = ("ZeRO-1/2: peak allocated and reserved from the allocator replay of the rank's events (one GPU's "
                 "forward and backward of the same micro-batch, with DeepSpeed's flat buffer, partitions, gradient "
                 "bucket and optimizer step in their place); on ten DeepSpeed ranks measured on one H100 and held out, "
                 "allocated median error 0.03%, worst -5.1% (ZeRO-1's gradients larger than the bucket, priced since: "
                 "in sample on 49 ranks, worst +1.6%), reserved median 0.03%, worst +11.1%")
"""What a ZeRO-1/2 rank's answer says of its replayed figures (docs/lab/zero-reserved-2026-12-07.md)."""
ZERO_RATIO = (f"ZeRO-1/2 reserved: the allocated bytes times {runtime.DEEPSPEED_RESERVED_OVER_ALLOCATED} (optimizer "
              "offload's events are not replayed); measured reserved over allocated runs 1.05-1.56")
"""What a ZeRO-1/2 rank's answer says of its reserved bytes (docs/lab/zero-reserved-2026-12-07.md)."""

INIT_PHASE = "DeepSpeed engine's initialisation"
"""Where a ZeRO-1/2 rank peaks when its step holds less than the engine's set-up does (optimizer offload, short
micro-batches)."""
ZERO_INIT = ("ZeRO-1/2: the step holds less than the engine's initialisation, where DeepSpeed copies the "
             "trainable parameters into one flat buffer while they still exist (the weights twice, for a moment; "
             "--peft lora flattens only the adapters)")


def _zero(spec: ModelSpec, inv: states.Inventory, setup: TrainSetup, precision: str, ms: dict[str, int],
          notes: list[str], card: GPU, step: Any) -> tuple[dict[str, int], str, dict[str, int], int | None]:
    """A ZeRO-1/2 rank. Without offload, the allocator replay of the rank's own events (`zero.rank_events`) gives
    its peak allocated and reserved bytes, and the parts at that peak (`_replayed_parts`). Under optimizer offload,
    whose events are not replayed: its states (`_rank_states`) plus, in forward and backward, what the same
    micro-batches' step holds beyond the states on one GPU (`zero.Excess`), in the optimizer step DeepSpeed's
    (`_zero_step`), and reserved bytes as a measured ratio (None here)."""
    found = step if step is not None else simulated_step(spec, setup, precision, card)
    rank = _rank_states(inv, setup, precision, ms)
    terms = {"simulated_excess": found.bytes, "optimizer_step_temporaries": rank.step_temporaries,
             "cublas_workspace": cuda.CUBLAS_HANDLES * card.cublas_workspace}
    _rank_notes(rank, setup, terms, notes)
    if rank.buffers:
        terms["deepspeed_buffers"] = rank.buffers
    step, step_phase, step_note, priced = _zero_step(inv, setup, rank, terms)
    made = _zero_events(spec, inv, setup, precision, found, priced) if priced is not None else None
    if made is not None:
        replayed = _replay(made.events, made.steady, setup.cap_bytes(precision), notes)
        memory, phase = _replayed_parts(made, replayed.allocated, found.activations, step_phase)
        terms["replayed_reserved"] = replayed.reserved
        reserved: int | None = max(replayed.reserved, memory["peak_allocated"])
        notes.append(ZERO_REPLAYED)
    else:
        # a window's ZeRO-2 gradient partition waits for its last micro-batch; ZeRO-1's whole gradients are in
        # `found`
        held = found.gradients if setup.shard == "zero1" else rank.gradients if setup.grad_accum > 1 else 0
        # DeepSpeed flattens on the GPU only where its free memory holds the flat buffer, else on the host
        flat = rank.flat_copy if rank.weights + rank.flat_copy <= card.capacity else 0
        candidates = [
            ({"weights": rank.weights, "gradients": held, "optimizer": rank.optimizer,
              "activations": found.activations,
              "other": found.bytes - found.activations - found.gradients + rank.buffers}, "forward/backward"),
            (step, step_phase),
            ({"weights": rank.weights + flat, "gradients": 0, "optimizer": 0, "activations": 0, "other": 0},
             INIT_PHASE),
        ]
        memory, phase = max(candidates, key=lambda c: sum(c[0].values()))  # the first of equals: the step's
        memory["peak_allocated"] = sum(memory.values())
        reserved = None
        notes += [ZERO_SIMULATED, ZERO_RATIO]
    if phase == INIT_PHASE:
        terms["deepspeed_init_peak"] = memory["peak_allocated"]
        notes.append(ZERO_INIT)
    elif phase == step_phase and step_note:
        notes.append(step_note)
    return memory, phase, terms, reserved


def _zero_events(spec: ModelSpec, inv: states.Inventory, setup: TrainSetup, precision: str, found: zero.Excess,
                 rank: int) -> zero.RankEvents | None:
    """The events of a ZeRO-1/2 rank without offload (`zero.rank_events`): of `rank`, the one the step priced;
    None where the single-GPU step's events are not at hand."""
    from trainmem.measure.deepspeed import ds_config

    sizes, grad_bytes = _flat_group(inv)
    bucket = ds_config(setup, precision, int(spec.text_config().hidden_size))["zero_optimization"]["reduce_bucket_size"]
    return zero.rank_events(found, setup.shard, sizes, grad_bytes, setup.shard_group, rank, bucket,
                            OPTIMIZERS[setup.optimizer].foreach)


def _replayed_parts(made: zero.RankEvents, allocated: int, activations: int,
                    step_phase: str) -> tuple[dict[str, int], str]:
    """The answer's parts at a ZeRO-1/2 rank's most allocated moment (`zero.peak_parts`), summing to the replay's
    `allocated` bytes, and its phase. Of the step's own blocks then held, the activations are those the
    single-GPU step saved for backward at its own peak (`activations`; none at the build or in the optimizer
    step); the rest, and the bytes by which the allocator's blocks exceed the requests, are "other"."""
    parts, mark = zero.peak_parts(made)
    phase = (INIT_PHASE if mark == "build" else step_phase if mark.endswith("optimizer") else "forward/backward")
    saved = min(activations, parts["rest"]) if phase == "forward/backward" else 0
    memory = {"weights": parts["weights"], "gradients": parts["gradients"], "optimizer": parts["optimizer"],
              "activations": saved}
    memory["other"] = max(allocated, sum(parts.values())) - sum(memory.values())
    memory["peak_allocated"] = sum(memory.values())
    return memory, phase


def _flat_group(inv: states.Inventory) -> tuple[list[int], int]:
    """The elements of each trainable parameter in the optimizer's order, and their bytes an element: DeepSpeed's
    flat group."""
    trainable = [p for p in inv.params if p.trainable]
    return [p.numel for p in trainable], int(max((p.bytes_per for p in trainable), default=4))


def _zero_step(inv: states.Inventory, setup: TrainSetup, rank: sharding.RankStates,
               terms: dict[str, int]) -> tuple[dict[str, int], str, str | None, int | None]:
    """A ZeRO-1/2 rank's optimizer step, what the answer says of it where it is the peak, and the rank it prices
    (the one `TrainSetup.rank` names, else the fullest; None under offload): DeepSpeed's own
    (`zero.optimizer_step`) on the GPU; under optimizer offload the GPU keeps the gradient partition and the staging
    buffer while the CPU steps."""
    memory = {"weights": rank.weights, "gradients": rank.gradients, "optimizer": rank.optimizer, "activations": 0,
              "other": rank.step_temporaries + terms["cublas_workspace"] + rank.buffers}
    if setup.offload == "none":
        sizes, grad_bytes = _flat_group(inv)
        asked = setup.rank % setup.shard_group if setup.rank is not None else None
        step = zero.optimizer_step(sizes, setup.shard_group, grad_bytes, OPTIMIZERS[setup.optimizer].foreach, asked)
        terms["optimizer_step_temporaries"] = step.other
        memory.update(gradients=step.gradients, other=step.other + terms["cublas_workspace"] + rank.buffers)
        which = f"rank {step.rank}" if asked is not None else f"rank {step.rank}, the fullest,"
        return memory, "optimizer step", (f"ZeRO-1/2 optimizer step: {which} peaks at its "
                                          f"{step.moment} ({ZERO_STEP[step.moment]})"), step.rank
    return memory, "optimizer step", None, None


ZERO_STEP = {"norm": "the gradients of its partition's parameters and the fp64 copy of its largest piece of one, "
                     "which DeepSpeed's gradient norm makes",
             "flatten": "the gradients of its partition's parameters, their flat copy and its fp32 cast at once",
             "update": "the fp32 gradient partition and the optimizer's temporaries"}
"""What a ZeRO-1/2 rank holds at each moment of DeepSpeed's optimizer step (`zero.StepPeak.moment`)."""


def _analytic(inv: states.Inventory, setup: TrainSetup, precision: str, ms: dict[str, int],
              notes: list[str], card: GPU) -> tuple[dict[str, int], str, dict[str, int]]:
    t = analytic.Traits.of(inv.model)
    # matmul outputs are half under fp16/bf16/autocast; under QLoRA bitsandbytes casts each 4-bit Linear's
    # output back to its input's dtype, fp32, because peft upcasts the embeddings and norms
    e = 2 if precision in ("fp16", "bf16", "amp-bf16", "amp-fp16") and setup.peft != "qlora" else 4
    # the residual stream runs in fp32 under autocast over fp32 weights and under QLoRA
    r = 4 if (precision.startswith("amp") or setup.peft == "qlora" or e == 4) else 2
    acts = analytic.activations(t, setup.batch_size, setup.seq_len, e, r, setup.checkpointing,
                                setup.attention == "eager", _lora_inputs(inv, setup, t.layers),
                                frozen=setup.peft != "none", flash=card.flash)
    terms = dict(acts.terms)
    saved = acts.saved
    if precision.startswith("amp") and setup.shard != "fsdp":
        # autocast's half copies of every matmul weight are saved for backward (2 bytes a parameter);
        # FSDP2's MixedPrecisionPolicy gathers the weights in half already, so autocast copies nothing
        terms["autocast_weight_copies"] = 2 * sum(p.numel for p in inv.params if len(p.shape) == 2)
        saved += terms["autocast_weight_copies"]
    rank = _rank_states(inv, setup, precision, ms)
    w, g, o, step_temp = rank.weights, rank.gradients, rank.optimizer, rank.step_temporaries
    _rank_notes(rank, setup, terms, notes)
    if rank.gathered:
        terms["gathered_units"] = rank.gathered
    g_resident = g if setup.grad_accum > 1 else 0
    transient = acts.backward_transient + rank.gathered + rank.buffers
    fwd_bwd = w + o + g_resident + saved + transient
    terms["optimizer_step_temporaries"] = step_temp
    workspace = cuda.CUBLAS_HANDLES * card.cublas_workspace
    terms["cublas_workspace"] = workspace
    step = w + g + o + step_temp + rank.buffers
    if fwd_bwd >= step:
        memory = {"weights": w, "gradients": g_resident, "optimizer": o, "activations": saved,
                  "other": transient + workspace}
        phase = "forward/backward"
    else:
        memory = {"weights": w, "gradients": g, "optimizer": o, "activations": 0,
                  "other": step_temp + workspace + rank.buffers}
        phase = "optimizer step"
    memory["peak_allocated"] = sum(memory.values())
    return memory, phase, terms


def _grouped_experts(inv: states.Inventory) -> bool:
    """Whether the model holds transformers' fused 3-D expert weights (run by `grouped_mm`)."""
    return any(len(p.shape) == 3 and "experts" in p.name for p in inv.params)


def _unquantized(inv: states.Inventory) -> tuple[int, str] | None:
    """Bytes of the frozen matrices QLoRA leaves unquantized (fused 3-D expert weights, Linear subclasses such
    as Falcon's), and what they are, or None. Embeddings and the output head stay 16-bit in every QLoRA setup
    and are not counted."""
    base = inv.model.get_base_model() if hasattr(inv.model, "get_base_model") else inv.model
    skip = {id(p) for m in (base.get_input_embeddings(), base.get_output_embeddings()) if m is not None
            for p in m.parameters()}
    ids = {n: id(p) for n, p in inv.model.named_parameters()}
    kinds: dict[str, int] = {}
    for p in inv.params:
        if p.trainable or p.quantized or len(p.shape) not in (2, 3) or ids.get(p.name) in skip:
            continue
        owner = inv.model.get_submodule(p.name.rpartition(".")[0])
        kind = "fused expert weights" if len(p.shape) == 3 else f"{type(owner).__name__} layers"
        kinds[kind] = kinds.get(kind, 0) + int(p.numel * p.bytes_per)
    if not kinds:
        return None
    total = sum(kinds.values())
    return total, ", ".join(k for k in sorted(kinds, key=kinds.get, reverse=True) if kinds[k] * 10 >= total)


def _largest_layer(inv: states.Inventory) -> int:
    """Bytes of the largest numbered block's parameters (what ZeRO-3 / FSDP gathers at a time)."""
    import re

    per: dict[str, int] = {}
    for p in inv.params:
        m = re.search(r"\.(\d+)\.", p.name)
        if m:
            per[m.group(1)] = per.get(m.group(1), 0) + int(p.numel * p.bytes_per)
    return max(per.values(), default=0)


def _step_scalars(inv: states.Inventory, optimizer: str) -> int:
    """torch AdamW's fp32 `step`, one per trainable parameter tensor the loss reaches (`states.optimizer` counts
    it), whole on every rank."""
    return 4 * sum(1 for p in inv.params if p.updated) if OPTIMIZERS[optimizer].step_scalar else 0


def _lora_inputs(inv: states.Inventory, setup: TrainSetup, layers: int) -> int:
    """Input features of the LoRA-adapted Linears of one layer (each keeps an fp32 dropout copy)."""
    if setup.peft not in ("lora", "qlora"):
        return 0
    widths = sum(p.shape[1] for p in inv.params if "lora_A" in p.name and len(p.shape) == 2)
    return widths // layers


def simulated_step(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU,
                   ready: dict[int, Any] | None = None) -> Any:
    """The recording ledger of `setup`'s simulated steps on `card`'s runtime: rank 0's under FSDP2, else the
    model's own (`simulate.simulate_step`); for a ZeRO-1/2 rank, what its forward and backward hold beyond the
    states (`zero.Excess`), from the same micro-batches' step on one GPU. `ready`: cut models already simulated,
    by depth (`cut_steps`)."""
    if zero.simulates(setup):
        single = zero.single_gpu(setup)

        def cut(k: int | None) -> Any:
            model = spec if k is None else spec.cut(k)
            return simulate_step(model_builder(model, single, precision, card), single, precision,
                                 workspace=card.cublas_workspace, flash=card.flash, sms=card.sms, splits=True)[0]
        return zero.rank_excess(spec.config, int(spec.text_config().num_hidden_layers), cut, setup.shard == "zero1")
    composed = compose.composed_step(spec.config, _composed_layers(spec, setup),
                                     lambda k: _simulated(spec.cut(k), setup, precision, card, splits=True),
                                     _first_cut(setup), ready)
    return composed if composed is not None else _simulated(spec, setup, precision, card)


def cut_steps(spec: ModelSpec, setups: list[TrainSetup], method: str = "auto") -> list[Any]:
    """The simulated steps of several setups of one model, for `estimate(..., step=...)`, where each is composed
    from cut models (`compose`): every cut model of every setup is one piece of one `forked.at_once`, the deepest
    first, so that both cores stay busy until the last piece (with one process per setup, a core waits while the
    setup with the most operators, LoRA's, finishes). None for a setup `estimate` prices otherwise (a model
    simulated whole, a ZeRO rank, the analytic method, a setup it refuses)."""
    from trainmem.errors import SetupError

    plans: list[tuple[TrainSetup, str, GPU] | None] = []
    for setup in setups:
        try:
            setup = setup.validate(spec)
            precision = setup.resolved_precision(spec, "cuda")
        except SetupError:
            plans.append(None)
            continue
        composes = (method in METHODS and _method(setup, method)[0] == "simulate" and not zero.simulates(setup)
                    and compose.composable(spec.config, _composed_layers(spec, setup)))
        plans.append((setup, precision, _runtime_card(setup)) if composes else None)
    pieces = sorted(((-k, i) for i, plan in enumerate(plans) if plan is not None
                     for k in compose.first_depths(_first_cut(plan[0]))))

    def simulate(piece: tuple[int, int]) -> Any:
        setup, precision, card = plans[piece[1]]  # type: ignore[misc]
        try:
            return compose.Recorded.of(_simulated(spec.cut(-piece[0]), setup, precision, card, splits=True))
        except (UnknownValue, NotImplementedError, SetupError):
            return None  # `estimate` meets it again and answers as it does (the analytic method, or the error)
    done: dict[int, dict[int, Any]] = {}
    for (k, i), ledger in zip(pieces, at_once(simulate, pieces)):
        done.setdefault(i, {})[-k] = ledger
    return [None if plan is None or None in done[i].values() else simulated_step(spec, *plan, done[i])
            for i, plan in enumerate(plans)]


def _simulated(model: ModelSpec, setup: TrainSetup, precision: str, card: GPU, splits: bool = False) -> Any:
    """The simulated ledger of `model` (whole or cut): FSDP2's rank 0, or one GPU's step on `card`'s runtime."""
    if setup.shard == "fsdp":
        return sharded.simulate_fsdp_rank(model, setup, precision, splits=splits)[0]
    return simulate_step(model_builder(model, setup, precision, card), setup, precision,
                         workspace=card.cublas_workspace, flash=card.flash, sms=card.sms, splits=splits)[0]


def _composed_layers(spec: ModelSpec, setup: TrainSetup) -> int:
    """The decoder layers a composed step extends to; 0 (never composed) under QLoRA, whose build holds one
    buffer that grows with the depth, which no cut composes: simulated whole at once."""
    return int(spec.text_config().num_hidden_layers) if setup.peft != "qlora" else 0


def _first_cut(setup: TrainSetup) -> int:
    return compose.SHARDED_FIRST if setup.shard == "fsdp" else compose.CUTS[0]


def _runtime_card(setup: TrainSetup) -> GPU:
    """The card whose runtime (cuBLAS workspace, SDPA kernel, memory outside the allocator) a step is simulated
    on: `--gpu`'s, without it the H200's, where the runtime figures were measured."""
    return find_gpu(setup.gpu) if setup.gpu else CATALOG["H200"]


def _simulate(spec: ModelSpec, setup: TrainSetup, precision: str, notes: list[str], card: GPU,
              step: Any = None) -> tuple[dict[str, int], str, dict[str, int], int]:
    ledger = step if step is not None else simulated_step(spec, setup, precision, card)
    if getattr(ledger, "balanced_routing", False):
        notes.append(ROUTING_BALANCED)
    if setup.shard == "fsdp":
        notes.append(f"simulated: rank 0 of {setup.shard_group}, FSDP2 under PyTorch's fake process group on fake CPU "
                     "tensors; not modelled: NCCL's buffers, overlap of communication with compute")
    memory = dict(ledger.peak_split)  # cuBLAS workspaces included: the simulation allocates them
    replayed = _replay(ledger.events or [], steady_start(ledger), setup.cap_bytes(precision), notes)
    # torch.cuda.max_memory_allocated counts the allocator's blocks, which hold more than was asked for where
    # a block is not split (a large-pool remainder of 1 MiB or less stays with it): the replay's peak, with
    # the excess in `other`
    memory["peak_allocated"] = max(ledger.peak, replayed.allocated)
    memory["other"] += memory["peak_allocated"] - ledger.peak
    phase = "optimizer step" if ledger.peak_phase.endswith("optimizer") else "forward/backward"
    terms = {"simulated_peak": ledger.peak, "cublas_workspace": cuda.CUBLAS_HANDLES * card.cublas_workspace,
             "replayed_reserved": replayed.reserved}
    if replayed.cap_request is not None:
        terms["cap_exceeded_at_request"] = replayed.cap_request
    return memory, phase, terms, replayed.reserved


@dataclasses.dataclass(frozen=True)
class _Replayed:
    reserved: int
    """Peak reserved bytes: what the step needs of the allocator."""
    allocated: int
    """Peak bytes of allocated blocks."""
    cap_request: int | None = None
    """Where the step does not fit the cap: the request the capped allocator could not serve."""


def _replay(events: list[tuple[int, int]], steady: int | None, cap: int | None, notes: list[str]) -> _Replayed:
    """The simulated steps under the caching allocator's policy, under the cap `--gpu`/`--memory-cap` sets
    (where a full allocator frees its cached segments and retries), the last step (from event `steady`)
    repeated until the allocator's layout settles.

    A step that runs out under the cap needs more than the card has; how much more is the smallest cap under
    which the same replay runs (`_need`): what a card needs to hold this step, continuous with the reserved
    bytes of setups that fit."""
    free, settled = _uncapped(events, steady)
    try:
        if cap is None or cap >= free.reserved:  # a cap its reserved bytes never reach changes nothing
            replayed = free
        else:
            a = allocator.CachingAllocator(cap=cap)
            settled = allocator.replay_steps(events, steady, a)
            replayed = _Replayed(a.peak_reserved, a.peak_allocated)
    except allocator.AllocatorOOM as e:
        fitted, settled = _need(events, steady, e.cap)
        notes.append(f"does not fit the {e.cap / 2**30:.2f} GiB the allocator may hold: a {e.requested / 2**20:.0f} MiB "
                     f"request fails with {e.reserved / 2**30:.2f} GiB reserved; the step needs "
                     f"{fitted.reserved / 2**30:.2f} GiB reserved, the smallest cap under which the same "
                     "allocator replay runs (as exact as the simulation below it)")
        replayed = dataclasses.replace(fitted, cap_request=e.requested)
    if not settled:
        notes.append(f"the allocator replay did not settle in {allocator.SETTLE_STEPS} more steps: later steps "
                     "may reserve more than estimated")
    return replayed


_UNCAPPED: dict[int, tuple[list, int | None, _Replayed, bool]] = {}
"""The uncapped replay of a step's events (by the list's id, the list kept so the id stays its own)."""


def _uncapped(events: list[tuple[int, int]], steady: int | None) -> tuple[_Replayed, bool]:
    """The step's replay with no cap, and whether it settled, once per step: every card of a runtime group
    replays one simulated step, and under a cap at or above that replay's reserved peak the capped allocator
    never reaches its cap (it frees its cache only for a segment that would cross it), so it replays the same."""
    kept = _UNCAPPED.get(id(events))
    if kept is None or kept[0] is not events or kept[1] != steady:
        top = allocator.CachingAllocator()
        settled = allocator.replay_steps(events, steady, top)
        kept = (events, steady, _Replayed(top.peak_reserved, top.peak_allocated), settled)
        _UNCAPPED[id(events)] = kept
        while len(_UNCAPPED) > _NEEDS_KEPT:
            del _UNCAPPED[next(iter(_UNCAPPED))]
    return kept[2], kept[3]


NEED_RESOLUTION = 2 * 2**20
"""The smallest cap is searched to this many bytes: the large pool's segment rounding (allocator.ROUND_LARGE)."""

_NEEDS: dict[int, tuple[list, _Replayed, bool]] = {}
"""The need found for a step's events (by the list's id, the list kept so the id stays its own): every card of a
runtime group replays one simulated step (`search.cards`), and a setup that fits none of them has one need."""
_NEEDS_KEPT = 16


def _need(events: list[tuple[int, int]], steady: int | None, failed: int) -> tuple[_Replayed, bool]:
    """The step's need: the replay under the smallest cap under which it runs, and whether that replay settled.
    Searched once per step, on one grid: from just under the step's most live requested bytes (`live_peak`,
    which no cap below holds) up, so that every card the step does not fit is told the same figure; where a
    cap it ran out under (`failed`) is at or above that figure (memory not monotone in the cap), again above it."""
    kept = _NEEDS.get(id(events))
    if kept is None or kept[0] is not events:
        kept = (events, *_smallest_cap(events, steady, allocator.live_peak(events) - 1))
        _NEEDS[id(events)] = kept
        while len(_NEEDS) > _NEEDS_KEPT:
            del _NEEDS[next(iter(_NEEDS))]
    need, settled = kept[1], kept[2]
    if need.reserved > failed:
        return need, settled
    return _smallest_cap(events, steady, failed)


def _smallest_cap(events: list[tuple[int, int]], steady: int | None, failed: int) -> tuple[_Replayed, bool]:
    """The replay under the smallest cap above `failed` (a cap it ran out under) under which it runs, found by
    bisection to `NEED_RESOLUTION`, and whether that replay settled. Without a cap the allocator never frees
    its cache, so the uncapped peak bounds the search from above (a cap that high is never reached); under a
    tighter cap a full allocator releases its free segments and retries, as a card of that size would."""
    best, settled = _uncapped(events, steady)
    lo, hi = failed, max(best.reserved, failed + NEED_RESOLUTION)
    while hi - lo > NEED_RESOLUTION:
        mid = (lo + hi) // 2
        a = allocator.CachingAllocator(cap=mid)
        try:
            ok = allocator.replay_steps(events, steady, a)
        except allocator.AllocatorOOM:
            lo = mid
            continue
        best, settled, hi = _Replayed(a.peak_reserved, a.peak_allocated), ok, mid
    return best, settled


__all__ = ["estimate", "simulated_only", "reads_sms", "states_floor", "simulated_step", "cut_steps", "Breakdown", "EstimateError",
           "METHODS", "ADVICE"]
