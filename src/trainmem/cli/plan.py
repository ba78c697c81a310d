"""The fastest setup that fits a card for an effective batch, with its predicted time.

Searches micro-batch x accumulation reaching --target-batch exactly, checkpointing on and off, and what
--allow opens (peft: full/LoRA/QLoRA; optimizer: the AdamW family; precision: what the card runs) on the
analytic estimate; keeps what fits --gpu (fits or tight), ranks by the step-time model, confirms the fastest
with the simulate method, and prints the winner's `trainmem run` command and `TrainingArguments`.
`--preset chapter` asks the seed chapter's question: polyglot-ko-1.3b, sequence 256, fp16, effective batch 16,
LoRA/QLoRA and checkpointing allowed. `--confirm` (CUDA) runs the winner and the runner-up for real.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from ..errors import SetupError
from ..gpus import find_gpu
from ..plan import DEFAULT_ALLOW, DIMENSIONS, FINALISTS, Plan, job_tokens, run_command, search, training_arguments
from .options import add_setup_arguments, setup_from_args

PRESETS = ("chapter",)


def register(p: argparse.ArgumentParser) -> None:
    add_setup_arguments(p)
    p.add_argument("--target-batch", metavar="N", help="the effective batch (samples per optimizer step) to reach exactly")
    p.add_argument("--preset", help="chapter: the seed chapter's model, sequence, precision and effective batch 16, "
                   "with peft and checkpointing allowed")
    p.add_argument("--allow", default=None, metavar="LIST",
                   help=f"what the search may change besides micro-batch x accumulation: comma list of "
                        f"{', '.join(DIMENSIONS)}, or none (default {','.join(DEFAULT_ALLOW)})")
    p.add_argument("--tokens", metavar="T", help="tokens the job trains: times for the whole job")
    p.add_argument("--epochs", metavar="E", help="with --dataset-size: epochs the job trains")
    p.add_argument("--dataset-size", metavar="D", help="with --epochs: samples in the dataset (each --seq-len tokens)")
    p.add_argument("--margin", default="0.02", help="headroom kept free on the card, a fraction of its capacity (default 0.02)")
    p.add_argument("--top", default="6", metavar="K", help="setups listed (default 6)")
    p.add_argument("--finalists", default=str(FINALISTS), metavar="F",
                   help=f"fastest setups confirmed with the simulate method (default {FINALISTS})")
    p.add_argument("--all", action="store_true", help="list every micro-batch, not only the fastest of each kind")
    p.add_argument("--confirm", action="store_true", help="run the winner and the runner-up with `trainmem run` "
                   "(needs CUDA) and report measured against predicted step time")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _number(problems: list[str], flag: str, text: str | None, kind: type, low: float = 1) -> Any:
    if text is None:
        return None
    try:
        value = kind(text)
        if value < low:
            raise ValueError
        return value
    except ValueError:
        problems.append(f"{flag}: expected a {'whole ' if kind is int else ''}number >= {low}, got {text!r}")
        return None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """Plan's own flags, every problem reported at once; fills in the chapter preset's defaults."""
    problems: list[str] = []
    if args.preset is not None and args.preset not in PRESETS:
        problems.append(f"--preset: {args.preset!r} is not one of {', '.join(PRESETS)}")
    if args.preset == "chapter":
        from ..chapter import MODEL, RUNS

        seed = RUNS[0].setup
        args.model = args.model or MODEL
        args.seq_len = args.seq_len or str(seed.seq_len)
        args.precision = args.precision or seed.precision
        args.optimizer = args.optimizer or seed.optimizer
        args.target_batch = args.target_batch or "16"
        args.allow = args.allow or "peft,checkpointing"
    for flag, value in (("--batch-size", args.batch_size), ("--grad-accum", args.grad_accum)):
        if value is not None:
            problems.append(f"{flag}: plan chooses the micro-batch and accumulation; give --target-batch instead")
    if args.model is None and args.config is None:
        problems.append("--model: which model to plan for (a preset, config.json, folder or hub id), or --preset chapter")
    if args.target_batch is None:
        problems.append("--target-batch: the effective batch to reach, e.g. --target-batch 16")
    if args.gpu is None:
        from ..gpus import this_card

        args.gpu = this_card()
        if args.gpu is None:
            problems.append("--gpu: the card to plan for, e.g. --gpu T4 (with CUDA it defaults to this machine's card)")
    allow = DEFAULT_ALLOW if args.allow is None else tuple(a.strip() for a in args.allow.split(",") if a.strip())
    allow = () if allow == ("none",) else allow
    unknown = [a for a in allow if a not in DIMENSIONS]
    if unknown:
        problems.append(f"--allow: {', '.join(map(repr, unknown))} not among {', '.join(DIMENSIONS)} (or none)")
    if (args.epochs is None) != (args.dataset_size is None):
        problems.append("--epochs and --dataset-size go together (or give --tokens)")
    if args.tokens is not None and args.epochs is not None:
        problems.append("--tokens: give either --tokens or --epochs with --dataset-size, not both")
    out = {"allow": allow, "target": _number(problems, "--target-batch", args.target_batch, int),
           "tokens": _number(problems, "--tokens", args.tokens, int),
           "epochs": _number(problems, "--epochs", args.epochs, float, 0.001),
           "dataset": _number(problems, "--dataset-size", args.dataset_size, int),
           "top": _number(problems, "--top", args.top, int),
           "finalists": _number(problems, "--finalists", args.finalists, int, 0),
           "margin": _number(problems, "--margin", args.margin, float, 0)}
    if out["margin"] is not None and out["margin"] >= 1:
        problems.append(f"--margin: expected a fraction in [0, 1), got {args.margin!r}")
    if args.confirm:
        import torch

        if not torch.cuda.is_available():
            problems.append("--confirm: runs the winner and the runner-up with `trainmem run`, which needs a CUDA "
                            "device, and none is visible here; drop --confirm for the plan from the estimate alone")
    if problems:
        raise SetupError(problems)
    return out


def main(args: argparse.Namespace) -> int:
    opts = _options(args)
    spec, base = setup_from_args(args)
    card = find_gpu(base.gpu)  # type: ignore[arg-type]
    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 110)  # a file or a pipe: the table's columns unwrapped
    job = job_tokens(opts["tokens"], opts["epochs"], opts["dataset"], base.seq_len)
    with console.status(f"planning {spec.name} on the {card.name}..."):
        plan = search(spec, base, card, opts["target"], opts["allow"], opts["margin"], opts["finalists"], job,
                      every=args.all)
    plan.options = plan.options[:opts["top"]]
    confirmed = _confirm(spec, plan, console) if args.confirm and plan.options else []
    if args.json:
        sys.stdout.write(json.dumps({**plan.to_dict(), "confirmed": confirmed}) + "\n")
    else:
        print_plan(plan, console, opts["allow"])
    return 0 if plan.options else 1


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    h, rest = divmod(int(round(s)), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _describe(setup: Any, varied: tuple[str, ...] = ("precision", "optimizer")) -> str:
    """micro x accum, the method, checkpointing, and the fields the search varied."""
    words = [f"{setup.batch_size} x {setup.grad_accum}", "full" if setup.peft == "none" else setup.peft]
    words += ["ckpt"] if setup.checkpointing else []
    words += [str(getattr(setup, f)) for f in varied]
    return " ".join(words)


def print_plan(plan: Plan, console: Console, allow: tuple[str, ...] = ()) -> None:
    """The ranked table, then the winner's command and TrainingArguments."""
    varied = tuple(f for f in ("precision", "optimizer") if f in allow)
    first = plan.options[0].setup if plan.options else None
    fixed = "" if first is None else ", ".join(f"{getattr(first, f)}" for f in ("precision", "optimizer") if f not in varied)
    job = f"; job: {plan.job_tokens:,} tokens" if plan.job_tokens else ""
    console.print(f"[bold]{plan.model} on the {plan.gpu}: effective batch {plan.target_batch} x {plan.seq_len} tokens"
                  f"{', ' + fixed if fixed else ''}{job}[/bold]", highlight=False)
    console.print(f"{plan.searched} setups estimated, {plan.not_fitting} do not fit; the fastest of each kind, "
                  "fastest first (predicted: docs/time-model.md)", highlight=False)
    if not plan.options:
        console.print(f"[red]Nothing fits the {plan.gpu}[/red] at effective batch {plan.target_batch}; "
                      "allow more with --allow peft,optimizer,precision, or pick a bigger card.")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    columns = ["#", "micro x accum", "peak", "free", "verdict", "step", "tokens/s", "MFU"] + (["job"] if plan.job_tokens else [])
    for col in columns:
        table.add_column(col, justify="left" if col in ("micro x accum", "verdict") else "right", no_wrap=True)
    for i, o in enumerate(plan.options, 1):
        level = "[green]fits[/green]" if o.level == "fits" else "[yellow]tight[/yellow]"
        row = [str(i), _describe(o.setup, varied), _gib(o.need), _gib(o.headroom),
               f"{level} ({'sim' if o.checked == 'simulate' else 'ana'})", f"{o.step_s * 1000:,.0f} ms",
               f"{o.tokens_per_s:,.0f}", f"{o.mfu:.0%}"]
        table.add_row(*row, *([_duration(plan.job_s(o))] if plan.job_tokens else []))
    console.print(table)
    console.print("peak: reserved + outside the allocator; free: within the margin; sim/ana: simulate/analytic "
                  "verdict", style="dim", highlight=False)
    for d in plan.dropped:
        s = d["setup"]
        console.print(f"dropped: {s['batch_size']} x {s['grad_accum']} {s['peft']}"
                      f"{' ckpt' if s['checkpointing'] else ''}: the analytic estimate says {d['analytic']}, "
                      f"simulate says {d['simulate']} ({_gib(d['need'])} needed)", highlight=False)
    win = plan.options[0]
    console.print(f"\n[bold]Winner[/bold]: {run_command(plan.model, win.setup)}", highlight=False, soft_wrap=True)
    console.print(training_arguments(win.setup), highlight=False, soft_wrap=True)
    if win.level == "tight":
        console.print("[yellow]The winner is tight: less than the margin stays free; the next one down is safer.[/yellow]")
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _confirm(spec: Any, plan: Plan, console: Console) -> list[dict[str, Any]]:
    """Run the winner and the runner-up for real and set their measured step time beside the prediction for
    this machine's card (the plan's card when it is the same, else re-predicted here)."""
    from ..estimator import estimate
    from ..gpus import this_card
    from ..runner import run

    here = this_card()
    out = []
    for option in plan.options[:2]:
        setup = option.setup.replace(steps=8)
        with console.status(f"running {_describe(setup)} on this GPU..."):
            row = run(spec, setup)
        tp = row.throughput or {}
        measured = tp.get("step_time_median_s") or tp.get("step_time_s")
        predicted = option.step_s if here == plan.gpu else (estimate(spec, setup.replace(gpu=here), "analytic").time or {}).get("step_s")
        entry = {"setup": setup.to_dict(), "status": row.status, "measured_step_s": measured,
                 "predicted_step_s": predicted, "card": here,
                 "error": (predicted - measured) / measured if measured and predicted else None}
        out.append(entry)
        err = f"{entry['error']:+.0%}" if entry["error"] is not None else "-"
        console.print(f"confirmed {_describe(setup)} on the {here}: {row.status}, measured "
                      f"{(measured or 0) * 1000:.0f} ms/step, predicted {(predicted or 0) * 1000:.0f} ms ({err})",
                      highlight=False)
    return out
