"""Model states per GPU when training is spread over N data-parallel GPUs (analytic method only).

Rajbhandari et al. 2019 (ZeRO, arXiv 1910.02054), with Psi parameters and K optimizer bytes per
parameter: ZeRO-1 keeps 2Psi + 2Psi + K*Psi/N per GPU, ZeRO-2 2Psi + (2 + K)*Psi/N, ZeRO-3 (4 + K)*Psi/N;
for mixed-precision Adam K = 12 (fp32 master weights, momentum and variance), which is what DeepSpeed
keeps when the weights are fp16/bf16. PyTorch DDP and FSDP keep torch's optimizer states (in the
parameters' dtype). Activations are never sharded: each GPU runs its own micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass


ZERO3_MAX_LIVE = 10**9
"""Parameters (elements) a DeepSpeed ZeRO-3 rank keeps gathered at once: `stage3_max_live_parameters`, whose
default transformers' `auto` config leaves, with `stage3_max_reuse_distance` at the same 1e9 (DeepSpeed's
`zero/config.py`). Its backward holds that many gathered (or the whole model, if smaller): measured on an H100, the
weights at the peak of a llama-3.2-1b ZeRO-3 rank were its shard plus 1,901-1,907 MiB, 1e9 bf16 elements
(docs/lab/zero-held-out-2026-12-06.md)."""


@dataclass(frozen=True)
class RankStates:
    """Bytes one GPU holds, and the transient bytes of gathered (unsharded) units."""

    weights: int
    gradients: int
    optimizer: int
    step_temporaries: int
    gathered: int
    """ZeRO-3 / FSDP: parameters (and their gradients in backward) of the units gathered at a time."""
    notes: tuple[str, ...] = ()
    host: int = 0
    """Bytes of host (CPU) memory this rank's offloaded states take: what `--offload` moved off the GPU, and
    under ZeRO-Offload the fp32 gradient partition DeepSpeed copies to the host for its CPU optimizer step."""
    buffers: int = 0
    """Bytes of DeepSpeed's own GPU buffers held for the whole run: ZeRO-1/2 with optimizer offload stages each
    gradient through `temp_grad_buffer_for_gpu_offload`, as large as the largest trainable parameter in the
    weights' dtype (`stage_1_and_2.py`, allocated when the optimizer is built)."""
    flat_copy: int = 0
    """ZeRO-1/2: the bytes of the one flat buffer DeepSpeed's engine copies the trainable parameters into, in their
    dtype, while they still exist (`stage_1_and_2.py`: on the GPU where its free memory holds the buffer, else on
    the host); the parameters then become views of it. What the engine creates next (the fp32 partition and a
    zero gradient for it, 8 bytes a parameter over N) never exceeds the step's 12 over N."""


def rank_states(weights: int, gradients: int, optimizer: int, trainable: int, half_weights: bool,
                n: int, shard: str, offload: str, largest_layer: int, foreach_copy: bool,
                unsharded_optimizer: int = 0, zero3_live: int = 0, largest_param: int = 0,
                trainable_bytes: int = 0) -> RankStates:
    """Per-GPU states for `shard` over `n` GPUs.

    `weights`/`gradients`/`optimizer` are the single-GPU bytes, `trainable` the trainable parameter count,
    `largest_layer` the bytes of the largest decoder layer's parameters (what FSDP/ZeRO-3 gathers),
    `foreach_copy`: the optimizer step makes a temporary copy of the (local) gradients,
    `unsharded_optimizer`: optimizer bytes every rank keeps whole (torch AdamW's 4-byte `step` per
    parameter tensor, which FSDP2 does not shard: measured exactly by the fake-group and gloo runs),
    `zero3_live`: the bytes of the parameters DeepSpeed ZeRO-3 keeps gathered at once (`ZERO3_MAX_LIVE`),
    `largest_param`: the bytes of the largest trainable parameter (ZeRO-Offload's staging buffer, `buffers`),
    `trainable_bytes`: the trainable parameters' bytes in their dtype (ZeRO-1/2's `flat_copy`).
    FSDP2 pads dim 0 of each parameter to a multiple of `n`; the formulas leave that padding out.
    """
    notes: list[str] = []
    if shard in ("none", "ddp"):
        # DDP's reducer keeps gradient buckets as large as the gradients (gradient_as_bucket_view=False)
        extra = gradients if shard == "ddp" and n > 1 else 0
        if extra:
            notes.append("DDP gradient buckets: one more copy of the gradients (gradient_as_bucket_view=False)")
        return RankStates(weights, gradients + extra, optimizer, gradients if foreach_copy else 0, 0, tuple(notes))
    if shard.startswith("zero") and half_weights:
        # DeepSpeed's mixed-precision optimizer: fp32 master weights + fp32 Adam moments, K = 12
        optimizer = 12 * trainable
        notes.append("DeepSpeed mixed precision: fp32 master weights and moments, 12 bytes per trainable parameter")
    elif shard.startswith("zero"):
        # DeepSpeed's ZeRO optimizer steps an fp32 copy of the rank's flat partition even over fp32 weights
        # (stage 1/2 `single_partition_of_fp32_groups`: `.clone().float()`; stage 3 `fp32_partitioned_groups_flat`),
        # and the wrapped optimizer's `step` is one per flat group, not one per parameter tensor
        optimizer += 4 * trainable - unsharded_optimizer
        notes.append("DeepSpeed ZeRO: an fp32 copy of the rank's partition beside the optimizer's states, "
                     "4 bytes per trainable parameter")
    else:
        optimizer -= unsharded_optimizer
    opt = optimizer // n + (0 if shard.startswith("zero") else unsharded_optimizer)
    if shard == "zero1":
        w, g = weights, gradients
    elif shard == "zero2":
        w, g = weights, gradients // n
    else:  # zero3, fsdp: parameters sharded too, gathered a unit (decoder layer) at a time + one prefetched
        w, g = weights // n, gradients // n
    gathered = zero3_live if shard == "zero3" else 2 * largest_layer if shard == "fsdp" else 0
    host = 0
    if offload in ("optimizer", "params"):  # parameter offload steps the optimizer on the CPU too
        host += opt + (4 * trainable // n if shard.startswith("zero") else 0)
        opt = 0
        notes.append("optimizer states offloaded to CPU memory")
    if offload == "params" and shard in ("zero3", "fsdp"):
        host += w
        w = 0
        notes.append("parameters offloaded to CPU memory; gathered units still come to the GPU")
    step = g if foreach_copy and offload != "optimizer" else 0
    buffers = largest_param if shard in ("zero1", "zero2") and offload == "optimizer" else 0
    if buffers:
        notes.append("ZeRO-Offload: DeepSpeed stages each gradient on the GPU in a buffer of the largest parameter")
    flat = trainable_bytes if shard in ("zero1", "zero2") else 0
    return RankStates(w, g, opt, step, gathered, tuple(notes), host, buffers, flat)
