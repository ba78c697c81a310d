"""`trainmem plan --cluster 8xH100`: the fastest way to spread a global batch over a cluster's GPUs.

Every layout of the cluster is searched: a world size (a divisor of one node's GPUs, or whole nodes), a
sharding (one GPU: none; several: ddp, zero2, zero3, fsdp, which over several nodes is HSDP) and an offload
(none; optimizer for ZeRO/FSDP; params for ZeRO-3/FSDP). Within a layout, `plan.search` finds the fastest
micro-batch x accumulation (and what `allow` opens) reaching the global batch exactly, on the analytic
estimate of one rank (closed forms: a 70B FSDP simulation takes minutes) and the step-time model with its
communication term (`estimator.time.comm`). The layouts' options are then ranked together by step time;
GPU-hours for `tokens` follow. With `confirm`, the winner's rank is simulated where the simulate method models
it (FSDP without offload, and one GPU). The module imports no torch.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.hardware.interconnect import Cluster

from .plan import DEFAULT_ALLOW, TOP, EstimateFn, Option, job_tokens, search

SHARDS = ("ddp", "zero2", "zero3", "fsdp")
OFFLOADS = {"none": ("none",), "ddp": ("none",), "zero2": ("none", "optimizer"),
            "zero3": ("none", "optimizer", "params"), "fsdp": ("none", "optimizer", "params")}


@dataclass
class ClusterPlan:
    model: str
    cluster: str
    target_batch: int
    seq_len: int
    job_tokens: int | None
    options: list[Option] = field(default_factory=list)
    """Fitting setups of every layout, fastest step first."""
    searched: int = 0
    not_fitting: int = 0
    notes: list[str] = field(default_factory=list)
    comm_s: dict[str, float] = field(default_factory=dict)
    """Exposed communication per step of each timed setup (by its repr): the part of its step time that is
    derived, not measured on several GPUs."""

    def comm(self, option: Option) -> float:
        return self.comm_s.get(repr(option.setup), 0.0)

    def gpu_hours(self, option: Option) -> float | None:
        """GPU-hours of the job: its optimizer steps (the last counted whole) x step time x the setup's GPUs."""
        if self.job_tokens is None:
            return None
        steps = math.ceil(self.job_tokens / (self.target_batch * self.seq_len))
        return steps * option.step_s * option.setup.gpus / 3600

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "cluster": self.cluster, "target_batch": self.target_batch,
                "seq_len": self.seq_len, "job_tokens": self.job_tokens, "searched": self.searched,
                "not_fitting": self.not_fitting, "notes": self.notes,
                "options": [{**o.to_dict(), "comm_s": self.comm(o), "gpu_hours": self.gpu_hours(o)}
                            for o in self.options]}


def layouts(cluster: Cluster, target: int) -> list[tuple[int, int, str, str]]:
    """(GPUs, nodes, shard, offload) of every layout whose world size divides `target`: within one node any
    divisor of its GPUs, across nodes whole nodes (a divisor of the nodes, all GPUs of each)."""
    worlds = [(k, 1) for k in range(1, cluster.per_node + 1) if cluster.per_node % k == 0]
    worlds += [(m * cluster.per_node, m) for m in range(2, cluster.nodes + 1) if cluster.nodes % m == 0]
    out = []
    for gpus, nodes in worlds:
        if target % gpus:
            continue
        for shard in (SHARDS if gpus > 1 else ("none",)):
            if shard == "fsdp" and nodes > 1 and gpus // nodes < 2:
                continue  # HSDP needs a shard group of two or more
            out += [(gpus, nodes, shard, offload) for offload in OFFLOADS[shard]]
    return out


def plan_cluster(spec: ModelSpec, base: TrainSetup, cluster: Cluster, target: int,
                 allow: Iterable[str] = DEFAULT_ALLOW, margin: float = 0.02, tokens: int | None = None,
                 epochs: float | None = None, dataset_size: int | None = None, top: int | None = TOP,
                 confirm: bool = False, estimate_fn: EstimateFn | None = None,
                 searching: Callable[[str], Any] | None = None, **_: Any) -> ClusterPlan:
    """The fastest setups of `base` reaching the global batch `target` on `cluster` (see the module docstring),
    the `top` first; `tokens` (or `epochs` x `dataset_size` samples) for GPU-hours. `estimate_fn` (setup,
    method) -> Breakdown is injectable for tests; `searching` a context factory given what is being done (the
    CLI's spinner). Keywords of `make_plan` that do not apply here (finalists, every) are taken and ignored."""
    if target < 1:
        raise SetupError([f"--target-batch: expected a whole number >= 1, got {target}"])
    allow = tuple(allow)
    status = searching or (lambda what: contextlib.nullcontext())
    plan = ClusterPlan(spec.name, str(cluster), target, base.seq_len, job_tokens(tokens, epochs, dataset_size,
                                                                                base.seq_len))
    shapes = layouts(cluster, target)
    if not shapes:
        raise SetupError([f"--target-batch {target}: no world size of the {cluster} divides it; give a multiple "
                          f"of {cluster.per_node}"])
    with status(f"planning {spec.name} on {cluster}: {len(shapes)} layouts..."):
        found = _search(spec, base, cluster, target, allow, margin, estimate_fn, shapes, plan)
    found.sort(key=lambda o: (float(f"{o.step_s:.3g}"), o.setup.gpus, o.need))
    plan.options = found[:top]
    if any(o.setup.offload != "none" for o in plan.options):
        plan.notes.append(OFFLOAD_TIME)
    if confirm and plan.options:
        with status("simulating the winner's rank..."):
            plan.options[0] = _confirm(spec, plan.options[0], cluster, margin, estimate_fn, plan)
    return plan


OFFLOAD_TIME = ("offload rows: their host transfers are timed (PCIe), the optimizer step on the host CPU is not (it "
                "is taken at the GPU's speed), so an offload row ranks higher here than its real step time would put it")
"""Said under a plan that lists an offload layout: no sourced figure for a CPU optimizer step's speed is in trainmem."""


def _search(spec: ModelSpec, base: TrainSetup, cluster: Cluster, target: int, allow: tuple[str, ...],
            margin: float, estimate_fn: EstimateFn | None, shapes: list[tuple[int, int, str, str]],
            plan: ClusterPlan) -> list[Option]:
    """Each layout's fitting options (`plan.search`, analytic, nothing simulated), counts and notes into `plan`."""
    found: list[Option] = []

    def timed(setup: TrainSetup, b: Any) -> dict[str, float]:
        plan.comm_s[repr(setup)] = (b.time or {}).get("comm", {}).get("exposed_s", 0.0)
        return b.time or {}

    for gpus, nodes, shard, offload in shapes:
        layout = base.replace(gpus=gpus, nodes=nodes, gpus_per_node=None, shard=shard, offload=offload)
        try:
            one = search(spec, layout, cluster.card, target // gpus, allow, margin, finalists=0,
                         estimate_fn=estimate_fn, time_fn=timed)
        except SetupError as e:
            plan.notes.append(f"{gpus} GPUs {shard}" + (f" offload {offload}" if offload != "none" else "")
                              + f" not searched: {e.problems[0]}")
            continue
        plan.searched += one.searched
        plan.not_fitting += one.not_fitting
        plan.notes += [n for n in one.notes if n not in plan.notes]
        found += one.options
    return found


def _confirm(spec: ModelSpec, option: Option, cluster: Cluster, margin: float, estimate_fn: EstimateFn | None,
             plan: ClusterPlan) -> Option:
    """The winner's rank simulated (rank 0 of its FSDP group, with at most 2 micro-batches), where the simulate
    method models it; else the analytic figure stays and a note says why."""
    from trainmem.estimator import estimate
    from trainmem.estimator.memory.sharded import simulates

    s = option.setup
    if s.gpus > 1 and not simulates(s):
        plan.notes.append(f"--confirm: the winner's --shard {s.shard}"
                          + (f" --offload {s.offload}" if s.offload != "none" else "")
                          + " has the analytic estimate only; its figures stay analytic")
        return option
    b = (estimate_fn or (lambda x, m: estimate(spec, x, m)))(s.replace(grad_accum=min(s.grad_accum, 2)), "simulate")
    v = b.verdict(cluster.card, margin)
    plan.notes.append(f"--confirm: the winner's rank simulated: {v['level']}, needs {v['need'] / 2**30:.1f} GiB "
                      f"(analytic: {option.need / 2**30:.1f} GiB)")
    return Option(s, v["level"], v["need"], v["headroom"], option.step_s, option.tokens_per_s, option.mfu,
                  "simulate")


__all__ = ["ClusterPlan", "layouts", "plan_cluster", "SHARDS", "OFFLOADS"]
