"""`trainmem plan`'s own flags (argparse names -> text as given) as `make_plan`'s keyword arguments, every
problem reported at once, and the setup flags a `--preset` fills in."""

from __future__ import annotations

import argparse
from typing import Any

from trainmem.errors import SetupError
from trainmem.hardware.gpus import this_card
from trainmem.hardware.interconnect import Cluster, parse_cluster
from trainmem.search.plan import (
    DEFAULT_ALLOW,
    DIMENSIONS,
    FINALISTS,
    NO_GPU,
    TOP,
    confirm_problem,
)

from .options import margin

PRESETS = ("chapter",)


def preset_flags(name: str | None) -> dict[str, str]:
    """The flags (argparse names, as text) a `--preset` fills in where they are not given."""
    if name != "chapter":
        return {}
    from trainmem.config.chapter import MODEL, RUNS

    seed = RUNS[0].setup
    return {"model": MODEL, "seq_len": str(seed.seq_len), "precision": seed.precision, "optimizer": seed.optimizer,
            "target_batch": "16", "allow": "peft,checkpointing"}


def _number(problems: list[str], flag: str, text: str | None, kind: type, low: float = 1,
            high: float = 2**63 - 1) -> Any:
    """A flag's text as a `kind` number in [low, high], finite; else None and its problem."""
    if text is None:
        return None
    try:
        value = kind(text)
        if not (low <= value <= high):  # NaN fails both comparisons
            raise ValueError
        return value
    except (TypeError, ValueError, OverflowError):
        what = f"{'whole ' if kind is int else ''}number from {low:g} to {high:g}"
        problems.append(f"{flag}: expected a {what}, got {text!r}")
        return None


def read_flags(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`trainmem plan`'s own flags (argparse names -> text as given) as `make_plan`'s keyword arguments, every
    problem reported at once in one SetupError; and the flags with the preset's values and this machine's card
    filled in where they are not given, from which the setup is then read."""
    problems: list[str] = []
    preset = given.get("preset")
    if preset is not None and preset not in PRESETS:
        problems.append(f"--preset: {preset!r} is not one of {', '.join(PRESETS)}")
    flags = dict(given)
    for name, value in preset_flags(preset).items():
        flags[name] = flags.get(name) or value
    for flag in ("--batch-size", "--grad-accum"):
        if flags.get(flag[2:].replace("-", "_")) is not None:
            problems.append(f"{flag}: plan chooses the micro-batch and accumulation; give --target-batch instead")
    if flags.get("model") is None and flags.get("config") is None:
        problems.append("--model: which model to plan for (a preset, config.json, folder or hub id), or --preset chapter")
    if flags.get("target_batch") is None:
        problems.append("--target-batch: the effective batch to reach, e.g. --target-batch 16")
    cluster = _cluster(flags, problems) if flags.get("cluster") is not None else None
    if flags.get("gpu") is None and flags.get("cluster") is None:  # a cluster, even a mistyped one, names the card
        flags["gpu"] = this_card()
        if flags["gpu"] is None:
            problems.append(NO_GPU)
    text = flags.get("allow")
    allow = DEFAULT_ALLOW if text is None else tuple(a.strip() for a in text.split(",") if a.strip())
    allow = () if allow == ("none",) else allow
    unknown = [a for a in allow if a not in DIMENSIONS]
    if unknown:
        problems.append(f"--allow: {', '.join(map(repr, unknown))} not among {', '.join(DIMENSIONS)} (or none)")
    epochs, dataset, tokens = flags.get("epochs"), flags.get("dataset_size"), flags.get("tokens")
    if (epochs is None) != (dataset is None):
        problems.append("--epochs and --dataset-size go together (or give --tokens)")
    if tokens is not None and epochs is not None:
        problems.append("--tokens: give either --tokens or --epochs with --dataset-size, not both")
    # the job's tokens and time must stay finite floats: 1e18 tokens is a million times today's largest runs
    out = {"allow": allow, "target": _number(problems, "--target-batch", flags.get("target_batch"), int,
                                             high=2**31 - 1),
           "tokens": _number(problems, "--tokens", tokens, int, high=10**18),
           "epochs": _number(problems, "--epochs", epochs, float, 0.001, 10**6),
           "dataset_size": _number(problems, "--dataset-size", dataset, int, high=10**12),
           "top": _number(problems, "--top", flags.get("top", str(TOP)), int),
           "finalists": _number(problems, "--finalists", flags.get("finalists", str(FINALISTS)), int, 0),
           "margin": margin(argparse.Namespace(margin=flags.get("margin", "0.02")), problems)}
    confirming = confirm_problem() if flags.get("confirm") and flags.get("cluster") is None else None
    problems += [confirming] if confirming else []
    if problems:
        raise SetupError(problems)
    return {**out, "every": bool(flags.get("all")), "confirm": bool(flags.get("confirm")), "cluster": cluster}, flags


CHOSEN = ("gpus", "shard", "offload", "gpus_per_node", "gpu")
"""Setup flags `plan --cluster` chooses itself (the card is the cluster's)."""


def _cluster(flags: dict[str, Any], problems: list[str]) -> Cluster | None:
    """`--cluster` (with `--nodes`) as a Cluster; the flags it chooses itself are problems when given, and
    `--nodes` is taken out of the setup's flags (each layout sets its own)."""
    problems += [f"--{f.replace('_', '-')}: plan --cluster chooses it; drop it" for f in CHOSEN if flags.get(f)]
    nodes = _number(problems, "--nodes", flags.pop("nodes", None), int, high=2**31 - 1)
    try:
        cluster = parse_cluster(flags["cluster"], nodes)
    except ValueError as e:
        problems.append(str(e))
        return None
    flags["gpu"] = cluster.card.name
    return cluster


__all__ = ["PRESETS", "CHOSEN", "preset_flags", "read_flags"]
