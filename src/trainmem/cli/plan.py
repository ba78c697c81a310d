"""The fastest setup that fits a card for an effective batch, with its predicted time.

Searches micro-batch x accumulation reaching --target-batch exactly, checkpointing on and off, and what
--allow opens (peft: full/LoRA/QLoRA; optimizer: the AdamW family; precision: what the card runs) on the
analytic estimate; keeps what fits --gpu (fits or tight), ranks by the step-time model, confirms the fastest
with the simulate method, and prints the winner's `trainmem run` command and `TrainingArguments`.
`--preset` fills in a known question's flags. `--confirm` (CUDA) runs the winner and the runner-up for real.
`--cluster 8xH100` (or 2x8xH100, or with --nodes) ranks every way to spread the batch over the cluster
(`search.cluster`); there `--confirm` simulates the winner's rank instead.
"""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from trainmem.output.render import json_line, plan_console, print_cluster_plan, print_confirmed, print_plan
from trainmem.search.cluster import plan_cluster
from trainmem.search.plan import DEFAULT_ALLOW, DIMENSIONS, FINALISTS, TOP, make_plan

from . import options
from .plan_flags import read_flags


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p, command="plan")
    p.add_argument("--cluster", metavar="[M]xNxCARD", help="plan for a cluster: N GPUs a node (M nodes, or --nodes M): "
                   "world size, sharding, offload, micro-batch, accumulation and checkpointing, by step time")
    p.add_argument("--target-batch", metavar="N", help="the effective batch (samples per optimizer step) to reach exactly")
    p.add_argument("--preset", help="chapter: the tutorial chapter trainmem grew from: polyglot-ko-1.3b fine-tuned on "
                   "a T4 (sequence 256, fp16, effective batch 16, with peft and checkpointing allowed)")
    p.add_argument("--allow", default=None, metavar="LIST",
                   help=f"what the search may change besides micro-batch x accumulation: comma list of "
                        f"{', '.join(DIMENSIONS)}, or none (default {','.join(DEFAULT_ALLOW)})")
    p.add_argument("--tokens", metavar="T", help="tokens the job trains: times for the whole job")
    p.add_argument("--epochs", metavar="E", help="with --dataset-size: epochs the job trains")
    p.add_argument("--dataset-size", metavar="D", help="with --epochs: samples in the dataset (each --seq-len tokens)")
    options.add_margin(p)
    p.add_argument("--top", default=str(TOP), metavar="K", help=f"setups listed (default {TOP})")
    p.add_argument("--finalists", default=str(FINALISTS), metavar="F",
                   help=f"fastest setups confirmed with the simulate method (default {FINALISTS})")
    p.add_argument("--all", action="store_true", help="list every micro-batch, not only the fastest of each kind")
    p.add_argument("--confirm", action="store_true", help="run the winner and the runner-up with `trainmem run` "
                   "(needs CUDA) and report measured against predicted step time")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def main(args: argparse.Namespace) -> int:
    wanted, flags = read_flags(vars(args))  # with the preset's flags and, with CUDA, --gpu this card
    spec, base = options.setup_from_args(argparse.Namespace(**flags), default=None,
                                         peft_searched="peft" in wanted["allow"])  # LoRA values: its LoRA options
    console = plan_console(stderr=args.json)
    cluster = wanted.pop("cluster")
    if cluster is not None:
        plan = plan_cluster(spec, base, cluster, **wanted, searching=lambda text: console.status(escape(text)))
        sys.stdout.write(json_line(plan.to_dict()) + "\n") if args.json else print_cluster_plan(plan, console)
        return 0 if plan.options else 1
    plan = make_plan(spec, base, **wanted, searching=lambda text: console.status(escape(text)),
                     confirmed=lambda setup, entry: print_confirmed(setup, entry, console))
    if args.json:
        sys.stdout.write(json_line(plan.to_dict()) + "\n")
    else:
        print_plan(plan, console, wanted["allow"])
    return 0 if plan.options else 1
