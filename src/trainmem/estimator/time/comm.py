"""Communication time of one rank per optimizer step: what each collective moves, how long a ring takes to
move it, and how much of that the step's compute hides. Derived: not measured on several GPUs.

What is moved (S: the whole array a collective produces or consumes, as nccl-tests counts it):
- FSDP2 (and ZeRO-3, priced alike): per micro-step, an all-gather of each unit's parameters (a decoder layer;
  the root unit holds the rest: embeddings, final norm, head) in forward, and again in backward
  (`reshard_after_forward=True`), in the gather dtype (the half dtype under amp-*, else the weights'); a
  reduce-scatter of each unit's gradients of trainable parameters in the reduce dtype (fp32 under amp-*:
  `MixedPrecisionPolicy(reduce_dtype=fp32)`, else the weights').
- HSDP (`--shard fsdp` over several nodes): the above within a node, plus an all-reduce across nodes of the
  rank's reduced gradient shard (S = the unit's gradients / GPUs per node), over the network.
- DDP: one all-reduce of the gradients per optimizer step (accumulation under `no_sync`).
- ZeRO-1: one reduce-scatter of the gradients per optimizer step; ZeRO-2 one per micro-step (it keeps only
  its shard of the gradients); both then all-gather the updated parameters (half under DeepSpeed's mixed
  precision) after the optimizer step.
Collectives over all ranks of several nodes run at the network's bandwidth (the ring crosses the NICs).

Ring cost (nccl-tests doc/PERFORMANCE.md's bus bandwidth B): all-gather and reduce-scatter take
(n-1)/n x S / B, all-reduce 2(n-1)/n x S / B, plus NCCL's latency: a base per collective and one per ring
step, n-1 steps (2(n-1) for all-reduce) (`hardware.interconnect`).

Overlap (FSDP2's prefetch): units run in order, the next unit's collectives overlapping the current unit's
compute, so a pass exposes the first unit's all-gather, then per unit max(0, comm - compute), and in backward
the last unit's reduce-scatter (and cross-node all-reduce); in backward a unit's comm is the next unit's
all-gather plus its predecessor's reduce-scatter, which share the link. A unit's compute is the micro-step's
forward or backward time times its share of the parameters. DDP's and ZeRO's gradient collectives overlap the
backward (buckets as it proceeds): exposed = max(comm - backward, the last 25 MiB bucket); ZeRO's parameter
all-gather after the step is exposed whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainmem.config.setup import TrainSetup
from trainmem.estimator.memory.states import Inventory
from trainmem.hardware.gpus import GPU
from trainmem.hardware.interconnect import BASE_LATENCY_S, NETWORKS, Link, intra_node

BUCKET = 25 * 1024**2
"""DDP's default gradient bucket (`bucket_cap_mb=25`): the last one is reduced after the backward ends."""
DERIVED = "derived: not measured on several GPUs"


@dataclass(frozen=True)
class Unit:
    """What one FSDP unit moves: its parameters as gathered, its gradients as reduced (bytes, unsharded)."""

    name: str
    gather: float
    grads: float
    numel: int


@dataclass(frozen=True)
class Collective:
    """One kind of collective of a step: `count` calls a step moving `bytes` in all (nccl-tests' S, summed)."""

    kind: str
    """all-gather, reduce-scatter or all-reduce."""
    what: str
    bytes: float
    ranks: int
    link: str
    count: int
    seconds: float
    """Ring time of all `count` calls, none of it hidden."""


@dataclass
class CommTime:
    exposed_s: float
    """Seconds a step waits on communication: added to the step time."""
    total_s: float
    """Seconds of all collectives, hidden or not."""
    collectives: list[Collective] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)
    """Each link used: its name -> its source."""

    def to_dict(self) -> dict[str, Any]:
        return {"exposed_s": self.exposed_s, "total_s": self.total_s, "label": DERIVED, "links": dict(self.links),
                "collectives": [c.__dict__ for c in self.collectives]}


def ring_s(kind: str, size: float, n: int, link: Link) -> float:
    """Seconds of one ring collective over `n` ranks moving `size` bytes (nccl-tests' S) over `link`."""
    if n < 2 or size <= 0:
        return 0.0
    steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    return steps / n * size / (link.gbs * 1e9) + steps * link.latency_s + BASE_LATENCY_S


def units(inv: Inventory, precision: str) -> list[Unit]:
    """FSDP's units: the root (every parameter outside a numbered block) first, then each decoder layer in
    order, with the bytes gathered (half under amp-*) and the gradients reduced (fp32 under amp-*)."""
    amp = precision.startswith("amp")
    per: dict[str, list[float]] = {}
    for p in inv.params:
        m = re.search(r"\.(\d+)\.", p.name)
        key = m.group(1) if m else "root"
        u = per.setdefault(key, [0.0, 0.0, 0])
        u[0] += p.numel * (min(p.bytes_per, 2) if amp else p.bytes_per)
        u[1] += p.numel * (4 if amp else p.bytes_per) if p.trainable else 0
        u[2] += p.numel
    order = ["root"] + sorted((k for k in per if k != "root"), key=int)
    return [Unit(k, *per[k]) for k in order if k in per]


def _pass_exposed(comm: list[float], compute: list[float], tail: float = 0.0) -> float:
    """A pass's exposed seconds: the first comm whole, each next one less the previous unit's compute, the tail."""
    if not comm:
        return tail
    return comm[0] + sum(max(0.0, c - k) for c, k in zip(comm[1:], compute[:-1])) + tail


def comm_time(setup: TrainSetup, inv: Inventory, precision: str, card: GPU, forward_s: float,
              backward_s: float) -> CommTime | None:
    """Communication of one rank of `setup` per optimizer step on `card`s, with `forward_s` and `backward_s`
    the compute of one micro-step; None on one GPU or where the card has no link figures."""
    world = setup.gpus
    node = intra_node(card)
    if world < 2 or node is None:
        return None
    net = NETWORKS[setup.network]
    multi = setup.nodes > 1
    group, link = (setup.shard_group, node) if setup.hsdp or not multi else (world, net)
    us = units(inv, precision)
    total_params = sum(u.numel for u in us) or 1
    micro = setup.grad_accum
    out = CommTime(0.0, 0.0, links={link.name: link.source})
    if multi:
        out.links[net.name] = net.source

    def add(kind: str, what: str, size: float, n: int, over: Link, count: int, seconds: float) -> None:
        out.collectives.append(Collective(kind, what, size, n, over.name, count, seconds))
        out.total_s += seconds

    grads = sum(u.grads for u in us)
    if setup.shard in ("fsdp", "zero3"):
        ag = [ring_s("all-gather", u.gather, group, link) for u in us]
        rs = [ring_s("reduce-scatter", u.grads, group, link) for u in us]
        ar = ([ring_s("all-reduce", u.grads / group, setup.nodes, net) for u in us] if setup.hsdp
              else [0.0] * len(us))
        share = [u.numel / total_params for u in us]
        fwd = _pass_exposed(ag, [forward_s * s for s in share])
        back = list(reversed(range(len(us))))  # backward runs the units in reverse
        bcomm = [ag[i] + (rs[j] + ar[j] if k else 0.0) for k, (i, j) in enumerate(zip(back, [None, *back]))]
        bwd = _pass_exposed(bcomm, [backward_s * share[i] for i in back], rs[back[-1]] + ar[back[-1]])
        out.exposed_s = micro * (fwd + bwd)
        add("all-gather", "parameters, forward", sum(u.gather for u in us), group, link, micro * len(us),
            micro * sum(ag))
        add("all-gather", "parameters, backward", sum(u.gather for u in us), group, link, micro * len(us),
            micro * sum(ag))
        add("reduce-scatter", "gradients", grads, group, link, micro * len(us), micro * sum(rs))
        if setup.hsdp:
            add("all-reduce", "gradient shards across nodes", grads / group, setup.nodes, net, micro * len(us),
                micro * sum(ar))
        return out
    half = precision in ("fp16", "bf16")
    if setup.shard == "ddp":
        calls, t = 1, ring_s("all-reduce", grads, world, link)
        add("all-reduce", "gradients", grads, world, link, 1, t)
        last = ring_s("all-reduce", min(BUCKET, grads), world, link)
    else:  # zero1 once a step, zero2 each micro-step; DeepSpeed's mixed precision reduces half gradients
        zgrads = sum(u.numel for u in us if u.grads) * 2 if half else grads
        calls = micro if setup.shard == "zero2" else 1
        t = ring_s("reduce-scatter", zgrads, world, link)
        add("reduce-scatter", "gradients", zgrads, world, link, calls, calls * t)
        last = ring_s("reduce-scatter", min(BUCKET, zgrads), world, link)
        params = sum(u.numel for u in us if u.grads) * (2 if half else 4)
        gather = ring_s("all-gather", params, world, link)
        add("all-gather", "updated parameters", params, world, link, 1, gather)
        out.exposed_s += gather
    out.exposed_s += calls * max(t - backward_s, last)
    return out


__all__ = ["Unit", "Collective", "CommTime", "ring_s", "units", "comm_time", "BUCKET", "DERIVED"]
