"""Prove that gradient accumulation gives the full batch's gradient (and that the naive loss rule does not).

Computes the gradient of --full-batch samples in one batch, then accumulated over micro-batches of
--micro-batch samples, with trainmem's token-weighted loss and with the naive mean of micro-batch means, in
float64 on the CPU. Exits 0 when trainmem's gradient matches to 1e-10 relative (1e-5 in float32), 1 otherwise.
The model, --peft, --data, --seq-len and --checkpointing flags shape what is verified; the batch, precision,
optimizer, card and several-GPU flags of `trainmem run` are refused (the batch and dtype flags below
decide). Without --model (or --config) it verifies tiny-gpt-neox, on a GPU machine too.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainmem.measure.verify import DROPOUT_NOTE, TOLERANCES, VerifyReport, verify_accumulation
from trainmem.output.render import json_line

from . import options

# A float64 copy on the CPU: the GPU default of `run` (polyglot-ko-1.3b) would need tens of GiB here.
DEFAULT_MODEL = "tiny-gpt-neox"


def register(p: argparse.ArgumentParser) -> None:
    options.add_setup_arguments(p, command="verify-accumulation")
    p.add_argument("--full-batch", type=int, default=8, metavar="N", help="samples in the full batch (default 8)")
    p.add_argument("--micro-batch", type=int, default=3, metavar="N",
                   help="samples per micro-batch (default 3: the last micro-batch is partial)")
    p.add_argument("--dtype", choices=list(TOLERANCES), default="float64", help="weights' dtype (default float64)")
    p.add_argument("--dropout", action="store_true", help="keep dropout on (equality is then not expected)")
    p.add_argument("--json", action="store_true", help="print the report object as JSON")


def print_report(r: VerifyReport, console: Console) -> None:
    """The accumulation check in words: per group, trainmem's error next to the naive rule's, then the verdict."""
    console.print(f"[bold]{escape(str(r.model.get('name')))}[/bold]  {r.setup.get('peft')}, {r.dtype}, full batch "
                  f"{r.full_batch} = {r.micro_batches} micro-batches of {r.micro_batch} "
                  f"(label tokens {', '.join(map(str, r.label_tokens))})")
    table = Table(title="||g_acc - g_full|| / ||g_full||", show_edge=False)
    for name in ("group", "tensors"):
        table.add_column(name)
    table.add_column("trainmem", justify="right")
    table.add_column("naive (seed)", justify="right")
    for g in r.groups:
        table.add_row(g.group, str(g.tensors), f"{g.rel_error:.2e}", f"{g.naive_rel_error:.2e}")
    table.add_row("[bold]worst parameter[/bold]", "", f"[bold]{r.max_rel_error:.2e}[/bold]",
                  f"[bold]{r.naive_max_rel_error:.2e}[/bold]")
    console.print(table)
    if r.dropout:
        console.print(f"[yellow]{DROPOUT_NOTE}[/yellow]")
    verdict = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
    console.print(f"{verdict}: accumulated gradient vs full batch {r.max_rel_error:.1e} (bound {r.tolerance:.0e}); "
                  f"the naive rule is off by {r.naive_max_rel_error:.1e}; loss {r.loss_accumulated:.6g} vs "
                  f"{r.loss_full:.6g} (naive {r.loss_naive:.6g})")


def main(args: argparse.Namespace) -> int:
    if args.model is None and args.config is None:
        args.model = DEFAULT_MODEL
    spec, setup = options.setup_from_args(args)
    device = "cpu" if setup.device == "auto" else setup.device
    console = Console(stderr=args.json)
    with console.status(f"comparing gradients of {escape(spec.name)}..."):
        report = verify_accumulation(spec, setup, args.full_batch, args.micro_batch,
                                     args.dtype, device, args.dropout)
    if args.json:
        sys.stdout.write(json_line(report.to_dict()) + "\n")
    else:
        print_report(report, console)
    return 0 if report.passed else 1
