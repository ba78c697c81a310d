"""Several nodes, communication time and `plan --cluster`: the bytes of each collective against a hand count,
the ring's cost, HSDP's cross-node term, the cluster search on a tiny model, and one-line errors."""

from __future__ import annotations

import dataclasses

import pytest

from trainmem import ModelSpec, TrainSetup
from trainmem.cli.plan_flags import read_flags
from trainmem.errors import SetupError
from trainmem.estimator.memory.states import inventory
from trainmem.estimator.time.comm import comm_time, ring_s, units
from trainmem.hardware.gpus import CATALOG
from trainmem.hardware.interconnect import NETWORKS, Link, intra_node, parse_cluster
from trainmem.search.cluster import layouts, plan_cluster

SPEC = ModelSpec.resolve("tiny-llama")
H100 = CATALOG["H100-80GB"]
# tiny-llama by hand: hidden 64, 2 layers, 4 heads of 16 (2 key/value heads: k and v are 64 x 32), MLP 176,
# vocabulary 1024, untied head, no biases
LAYER = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176 + 2 * 64  # q, o; k, v; gate, up, down; two norms = 46,208
ROOT = 1024 * 64 * 2 + 64  # embeddings, head, final norm = 131,136
PARAMS = ROOT + 2 * LAYER  # 223,552


def _comm(precision: str = "fp32", **fields):
    setup = TrainSetup(seq_len=32, batch_size=1, precision=precision, **fields)
    return comm_time(setup, inventory(SPEC, setup, precision), precision, H100, 1e-3, 2e-3)


def _bytes(c) -> dict[tuple[str, str], float]:
    return {(x.kind, x.what): x.bytes for x in c.collectives}


def test_units_are_the_root_then_each_layer_by_hand():
    us = units(inventory(SPEC, TrainSetup(), "fp32"), "fp32")
    assert [(u.name, u.numel) for u in us] == [("root", ROOT), ("0", LAYER), ("1", LAYER)]


def test_fsdp_bytes_per_collective_at_world_8_by_hand():
    fp32 = _bytes(_comm(gpus=8, shard="fsdp"))
    assert fp32 == {("all-gather", "parameters, forward"): 4 * PARAMS, ("all-gather", "parameters, backward"): 4 * PARAMS,
                    ("reduce-scatter", "gradients"): 4 * PARAMS}
    amp = _bytes(_comm("amp-bf16", gpus=8, shard="fsdp"))  # gathered in bf16, reduced in fp32
    assert amp[("all-gather", "parameters, forward")] == 2 * PARAMS and amp[("reduce-scatter", "gradients")] == 4 * PARAMS


def test_ddp_and_zero_bytes_at_world_8_by_hand():
    assert _bytes(_comm(gpus=8, shard="ddp")) == {("all-reduce", "gradients"): 4 * PARAMS}
    zero2 = _comm("bf16", gpus=8, shard="zero2", grad_accum=3)  # half gradients, reduced each micro-step
    assert _bytes(zero2) == {("reduce-scatter", "gradients"): 2 * PARAMS, ("all-gather", "updated parameters"): 2 * PARAMS}
    assert [c.count for c in zero2.collectives] == [3, 1]


def test_ring_time_by_hand_and_monotone_in_bandwidth():
    link = intra_node(H100)
    assert link.gbs == 450.0  # NVLink4: 900 GB/s both ways
    assert ring_s("all-gather", 4 * PARAMS, 8, link) == pytest.approx(7 / 8 * 4 * PARAMS / 450e9 + 7 * 5.7e-6 + 8.4e-6)
    assert ring_s("all-reduce", 1e9, 8, link) == pytest.approx(2 * ring_s("all-gather", 1e9, 8, link) - 8.4e-6)
    times = [ring_s("reduce-scatter", 1e9, 8, Link("x", gbs, 5e-6, "")) for gbs in (10, 50, 100, 450, 900)]
    assert times == sorted(times, reverse=True) and len(set(times)) == 5
    totals = [_comm(gpus=16, nodes=2, shard="ddp", network=n).total_s for n in ("ib-hdr", "ib-ndr")]
    assert totals[0] > totals[1]  # HDR's 25 GB/s against NDR's 50 GB/s


def test_hsdp_adds_the_cross_node_all_reduce_and_keeps_the_node_shard():
    one = _comm(gpus=4, shard="fsdp")
    two = _comm(gpus=8, nodes=2, shard="fsdp")
    assert _bytes(two) == {**_bytes(one), ("all-reduce", "gradient shards across nodes"): 4 * PARAMS / 4}
    intra = [c for c in two.collectives if c.kind != "all-reduce"]
    assert all(c.ranks == 4 and c.link == "NVLink4" for c in intra)
    cross = next(c for c in two.collectives if c.kind == "all-reduce")
    assert cross.ranks == 2 and cross.link == NETWORKS["ib-ndr"].name and cross.seconds > 0
    assert two.total_s > one.total_s and two.exposed_s >= one.exposed_s


def test_hsdp_rank_memory_is_the_fsdp_rank_of_a_node():
    from trainmem.estimator import estimate

    setup = TrainSetup(seq_len=32, batch_size=1, precision="bf16", shard="fsdp")
    hsdp = estimate(SPEC, setup.replace(gpus=8, nodes=2), "analytic")
    fsdp = estimate(SPEC, setup.replace(gpus=4), "analytic")
    assert hsdp.memory == fsdp.memory
    assert hsdp.time["comm"]["exposed_s"] >= fsdp.time["comm"]["exposed_s"] > 0
    assert hsdp.time["step_s"] == pytest.approx(fsdp.time["step_s"] - fsdp.time["comm"]["exposed_s"]
                                                + hsdp.time["comm"]["exposed_s"])


@pytest.mark.parametrize("fields, flag", [
    (dict(gpus=8, nodes=3, shard="ddp"), "--nodes 3:"),
    (dict(gpus=8, nodes=2, gpus_per_node=8, shard="ddp"), "--gpus 8:"),
    (dict(gpus=2, nodes=2, shard="fsdp"), "--nodes 2:"),
    (dict(gpus=2, shard="ddp", network="ib-xdr"), "--network:"),
    (dict(gpus=2, shard="ddp", nodes=0), "--nodes:"),
])
def test_node_contradictions_are_one_line_naming_the_flag(fields, flag):
    problems = TrainSetup(**fields).problems()
    assert len(problems) == 1 and problems[0].startswith(flag) and "\n" not in problems[0]


def test_cluster_strings():
    assert (parse_cluster("8xH100").nodes, parse_cluster("8xH100").per_node) == (1, 8)
    c = parse_cluster("2x8xH100-80GB")
    assert (c.nodes, c.per_node, c.card.name, c.gpus) == (2, 8, "H100-80GB", 16)
    assert parse_cluster("8xH100", nodes=4).gpus == 32
    for text, start in [("8xfoo", "--cluster: unknown card"), ("H100", "--cluster:"), ("8xA100", "--cluster:"),
                        ("0x8xH100", "--cluster:")]:
        with pytest.raises(ValueError, match=f"^{start}"):
            parse_cluster(text)
    with pytest.raises(ValueError, match="^--nodes 3: --cluster 2x8xH100"):
        parse_cluster("2x8xH100", nodes=3)


def test_plan_cluster_flags_name_each_contradiction():
    given = {"model": "tiny-llama", "target_batch": "8", "cluster": "2x8xH100", "nodes": "3", "shard": "ddp",
             "gpu": "T4"}
    with pytest.raises(SetupError) as e:
        read_flags(given)
    assert sorted(p.split(":")[0] for p in e.value.problems) == ["--gpu", "--nodes 3", "--shard"]
    wanted, flags = read_flags({"model": "tiny-llama", "target_batch": "8", "cluster": "8xH100", "nodes": "2"})
    assert wanted["cluster"].gpus == 16 and flags["gpu"] == "H100-80GB" and "nodes" not in flags
    with pytest.raises(SetupError) as e:  # a mistyped card: the cluster's problem alone, not a missing --gpu
        read_flags({"model": "tiny-llama", "target_batch": "8", "cluster": "8xH1000"})
    assert [p.split(":")[0] for p in e.value.problems] == ["--cluster"]


def test_layouts_divide_the_batch_and_take_whole_nodes():
    shapes = layouts(parse_cluster("2x4xH100"), 16)
    assert {(g, n) for g, n, _, _ in shapes} == {(1, 1), (2, 1), (4, 1), (8, 2)}
    assert ("none", "none") == next((s, o) for g, _, s, o in shapes if g == 1)
    assert {s for g, _, s, _ in shapes if g == 8} == {"ddp", "zero2", "zero3", "fsdp"}
    assert {g for g, _, _, _ in layouts(parse_cluster("8xH100"), 4)} == {1, 2, 4}  # 8 GPUs cannot split 4


def test_plan_cluster_on_a_tiny_model_ranks_and_its_winner_fits():
    base = TrainSetup(seq_len=32, precision="bf16").validate(SPEC)
    plan = plan_cluster(SPEC, base, parse_cluster("2xH100"), 4, allow=(), tokens=10**6, top=None)
    assert plan.options and plan.searched > len(plan.options)
    steps = [o.step_s for o in plan.options]
    assert steps == sorted(steps) or [float(f"{s:.3g}") for s in steps] == sorted(float(f"{s:.3g}") for s in steps)
    win = plan.options[0]
    assert win.level in ("fits", "tight") and win.need <= H100.capacity
    assert all(o.setup.batch_size * o.setup.grad_accum * o.setup.gpus == 4 for o in plan.options)
    assert {o.setup.gpus for o in plan.options} == {1, 2}
    sharded = next(o for o in plan.options if o.setup.gpus == 2)
    assert plan.comm(sharded) > 0 and plan.gpu_hours(sharded) == pytest.approx(
        -(-10**6 // (4 * 32)) * sharded.step_s * 2 / 3600)
    assert dataclasses.asdict(plan.options[0])["checked"] == "analytic"


def test_a_plan_listing_an_offload_row_says_its_cpu_step_is_not_timed():
    """Parameter offload steps the optimizer on the CPU, whose time the step model does not price: a plan that
    lists such a row says so under its table."""
    from trainmem.search.cluster import OFFLOAD_TIME, plan_cluster

    plan = plan_cluster(ModelSpec.resolve("llama-3.1-8b"), TrainSetup(precision="amp-bf16", seq_len=2048),
                        parse_cluster("2x8xH100"), 64)
    listed = {o.setup.offload for o in plan.options}
    assert (OFFLOAD_TIME in plan.notes) == (listed != {"none"})
    assert listed != {"none"}  # this plan lists offload rows: the note's case is exercised
