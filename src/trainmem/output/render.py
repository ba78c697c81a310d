"""Terminal rendering of results with rich. Pure presentation: no measurement happens here."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from trainmem.config.commands import describe, run_command, training_arguments
from trainmem.config.setup import TrainSetup
from trainmem.hardware.gpus import find_gpu
from trainmem.result import Result
from trainmem.search.cluster import ClusterPlan
from trainmem.search.plan import Plan

GiB, MiB = 1024**3, 1024**2

_PARTS = [("weights", "weights (params, buffers, 4-bit states)"), ("gradients", "gradients"),
          ("optimizer", "optimizer states"), ("activations", "activations (saved by forward, logits)"),
          ("other", "other (backward/step temporaries, workspace)")]


def size(n: int | None) -> str:
    """Bytes as the seed prints them (GB = 1024**3), with MiB for small values."""
    if n is None:
        return "-"
    return f"{n / GiB:.3f} GiB" if abs(n) >= 100 * MiB else f"{n / MiB:.2f} MiB"


LEVEL_WORDS = {"fits": "[green]fits[/green]", "no": "[red]does not fit[/red]",
               "tight": "[yellow]tight[/yellow] (fits the capacity, with less than the margin free)"}


def verdict_line(v: dict[str, Any]) -> str:
    """The verdict in one line; rows written before levels existed have only `fits`."""
    level = v.get("level") or ("fits" if v["fits"] else "no")
    other = v.get("runtime") and v["runtime"] != v["gpu"]
    return (f"{v['gpu']}: {LEVEL_WORDS[level]}, headroom {size(v['headroom'])} (reserved + memory outside the "
            f"allocator vs capacity, {v['margin']:.0%} margin); cut first: {v['advice']}"
            + (f" (kernels and workspaces modelled on the {v['runtime']}: pass --gpu {v['gpu']} to model this card)"
               if other else ""))


def sweep_line(label: str, r: Result) -> str:
    """One sweep row as it finishes: its status and peak, the verdict where a card was given, and for
    the chapter's runs what the book saw on its T4 (the outcome is the thing to compare)."""
    from trainmem.config.chapter import find_run

    line = f"{label}: {r.status}, peak_allocated {r.memory['peak_allocated'] / 2**30:.3f} GiB"
    if r.verdict:
        level = r.verdict.get("level") or ("fits" if r.verdict["fits"] else "no")
        line += f"; {r.verdict['gpu']}: {level}, headroom {size(r.verdict['headroom'])}"
    run = find_run(r.setup) if r.model.get("name") == "polyglot-ko-1.3b" else None
    if run is not None:
        line += "; the book's T4: " + ("out of memory" if run.at_first_step_gb is None else "ran")
    return line


ROUTINE_NOTES = ("runtime figures derived from the H200 measurement", "time: derived from the ",
                 "the kernel memory model was validated on")
"""Parts of the notes an estimate repeats on every call, whatever the setup (the installed releases, the card's
runtime figures and step time derived from the H200 and its datasheet): shown with --verbose only."""


def routine(note: str) -> bool:
    """Whether `note` is one every estimate repeats (`ROUTINE_NOTES`), not one about this setup."""
    return any(part in note for part in ROUTINE_NOTES)


def cap_size(n: int) -> str:
    """A cap as a user would write it: 12.0 GiB, 500 MiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def _gb(n: int) -> str:
    return f"{n / GiB:.1f}"


def checked_advice(checked: list[dict[str, Any]], card: str) -> str:
    """The changes the verdict suggests, each estimated: what it then needs and whether that fits."""
    said = [f"{c['change']}: needs over {_gb(c['need'])} GiB (its weights, gradients and optimizer states alone), no"
            if c.get("floor") else f"{c['change']}: needs {_gb(c['need'])} GiB, {c['level']}" for c in checked]
    if any(c["level"] == "fits" for c in checked):
        return "checked: " + "; ".join(said)
    return f"no single change fits the {card}: " + "; ".join(said)


def headline(r: Result) -> Text:
    """The answer in one line, before anything else: the verdict in words (with what to cut first where it does
    not fit or is tight), a measurement's outcome on the card it emulated, or, without a card, the peak and how
    to get a verdict."""
    v, s = r.verdict, r.setup
    if r.kind == "estimate" and v:
        level = v.get("level") or ("fits" if v["fits"] else "no")
        card = f"the {v['gpu']}" if v["gpu"].endswith(" cap") else v["gpu"]
        runtime = f" (with the {v['runtime']}'s runtime figures)" if v.get("runtime") and v["runtime"] != v["gpu"] else ""
        need = v.get("need", v.get("capacity", 0) - v["headroom"])
        of = f"needs {_gb(need)} GiB of {_gb(v['capacity'])}" if "capacity" in v else f"headroom {size(v['headroom'])}"
        cut = f"; cut first: {v['advice']}"
        if level == "fits":
            return Text(f"fits {card}{runtime}: {of}, {_gb(v['headroom'])} GiB free beyond the {v['margin']:.0%} "
                        "margin", style="green")
        if level == "tight":
            free = v.get("capacity", 0) - need
            return Text(f"fits {card} tightly{runtime}: {of}, {_gb(free)} GiB free, less than the {v['margin']:.0%} "
                        f"margin{cut}", style="yellow")
        return Text(f"does not fit {card}{runtime}: {of} (peak reserved + memory outside the allocator){cut}",
                    style="red")
    if r.kind == "estimate":
        m = r.memory
        return Text(f"peak {size(m['peak_reserved'])} reserved ({size(m['peak_allocated'])} allocated) in the "
                    f"{r.peak_phase}, {r.method} estimate; for a verdict pass --gpu NAME (T4, RTX-4090, A100-80GB, "
                    "...) or --memory-cap SIZE")
    card = find_gpu(s["gpu"]) if s.get("gpu") else None
    cap = s.get("memory_cap")
    overhead = card.overhead(s["attention"], s["precision"], s["peft"]) if card is not None else 0
    steps = f"ran {r.steps_done} step{'s' if r.steps_done != 1 else ''}"
    if cap is not None and (card is None or cap < card.capacity - overhead):  # the cap binds, not the card
        name = f"the {cap_size(cap)} cap"
        if r.status == "oom":
            return Text(f"does not fit {name}: out of memory{_in(r)}; `trainmem estimate` with the same flags "
                        "says what to cut first", style="red")
        if r.status == "ok":
            return Text(f"fits {name}: {steps} with at most {size(r.memory['peak_reserved'])} reserved",
                        style="green")
    elif card is not None and r.status == "oom":
        return Text(f"does not fit {card.name}: out of memory{_in(r)} under its cap; `trainmem estimate` with the "
                    "same flags says what to cut first", style="red")
    elif card is not None and r.status == "ok":
        need = r.memory["peak_reserved"] + overhead
        free = card.budget(0.02) - need
        said = (f"{_gb(free)} GiB free beyond the 2% margin" if free >= 0 else
                f"{_gb(card.capacity - need)} GiB free, less than the 2% margin")
        return Text(f"fits {card.name}{' tightly' if free < 0 else ''}: {steps} under its cap and needs {_gb(need)} "
                    f"GiB of {_gb(card.capacity)} (peak reserved + the {card.name}'s memory outside the allocator), "
                    f"{said}", style="green" if free >= 0 else "yellow")
    status = {"ok": "ran", "oom": "ran out of memory", "error": "failed"}.get(r.status, r.status)
    return Text(f"{status}: {r.steps_done}/{s['steps']} steps on the {r.env.get('gpu') or s['device']}, peak "
                f"{size(r.memory['peak_allocated'])} allocated", style="red" if r.status != "ok" else "")


def _in(r: Result) -> str:
    return f" in {r.oom['phase']}" if r.oom else ""


def result_tables(r: Result, phases: bool = False, verbose: bool = False) -> list[Any]:
    """A row as the terminal shows it: the answer (`headline`), title, the memory at the peak, the figures after
    a step, throughput, OOM and notes (those every estimate repeats only with `verbose`; with `phases`, every
    phase). User text (model names, notes, errors) is escaped: `[` in it is text, not markup."""
    s = r.setup
    title = (f"{r.model.get('name')}  batch {s['batch_size']} x accum {s['grad_accum']} "
             f"(effective {r.effective_batch}), seq {s['seq_len']}, {s['peft']}, {s['precision']}, "
             f"{s['optimizer']}{', checkpointing' if s['checkpointing'] else ''}  "
             f"on {r.env.get('gpu') or (r.kind == 'estimate' and s.get('gpu')) or s['device']}")
    out: list[Any] = [headline(r)]
    priced = [n for n in r.notes if n.startswith("priced: ")]  # which Mamba path, and the other's figure
    out += [Text(n) for n in priced]
    checked = (r.verdict or {}).get("checked")
    if checked:
        out.append(Text(checked_advice(checked, r.verdict["gpu"])))
    out.append(f"[bold]{escape(title)}[/bold]")
    if r.kind == "estimate":
        gpus = s.get("gpus", 1)
        where = f"one GPU of {gpus} ({s.get('shard')})" if gpus > 1 else "one CUDA GPU"
        out.append(f"estimate ({r.method} method) for {where}; the peak is in the {r.peak_phase}")
    else:
        status = {"ok": "[green]ok[/green]", "oom": "[red]out of memory[/red]", "error": "[red]error[/red]"}[r.status]
        cap = f"  (memory capped to {escape(s['gpu'])})" if s.get("gpu") else ""
        out.append(f"status: {status}{cap}   steps done: {r.steps_done}/{s['steps']}   peak in {r.peak_phase}")
    mem = Table(title="Memory at the peak", show_edge=False)
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    mem.add_column("size", justify="right")
    m = r.memory
    experts = (r.terms or {}).get("expert_weights")
    for key, label in _PARTS:
        mem.add_row(label, f"{m[key]:,}", size(m[key]))
        if key == "weights" and experts:  # a mixture of experts: every expert is held, whichever the tokens pick
            mem.add_row("  of which experts (all of them)", f"{experts:,}", size(experts))
    mem.add_row("[bold]peak allocated[/bold]", f"{m['peak_allocated']:,}", size(m["peak_allocated"]))
    mem.add_row("peak reserved (allocator)", f"{m['peak_reserved']:,}", size(m["peak_reserved"]))
    dev_label = "device used (context + reserved)" if s["device"] == "cuda" else "process peak RSS"
    mem.add_row(dev_label, f"{m['device_used']:,}", size(m["device_used"]))
    out.append(mem)
    over = sum(m[key] for key, _ in _PARTS) - m["peak_allocated"]
    if over > 0:  # a part lives outside the allocator whose peak this is (paged optimizer states)
        out.append(f"the parts exceed peak allocated by {size(over)}: some of them live outside PyTorch's "
                   "allocator (paged optimizer states are in CUDA managed memory)")
    ms = r.model_states
    out.append(f"after an optimizer step: optimizer states {size(ms['optimizer'])}, "
               f"gradients {size(ms['gradients'])}, weights {size(ms['weights'])}")
    tp = r.throughput
    if tp.get("tokens_per_s"):
        out.append(f"throughput: {tp['tokens_per_s']:,.0f} tokens/s, {tp['step_time_s'] * 1000:.1f} ms/step "
                   f"over {tp['timed_steps']} unprobed step(s)")
    if r.time.get("step_s"):
        t = r.time
        out.append(f"predicted time on the {escape(t['card'])}: {t['step_s'] * 1000:.1f} ms/step, "
                   f"{t['tokens_per_s']:,.0f} tokens/s, MFU {t['mfu']:.0%}"
                   + (" (derived from its datasheet figures)" if t.get("derived") else "")
                   + (f", of which {t['comm']['exposed_s'] * 1000:.1f} ms exposed communication "
                      f"({t['comm']['label']})" if t.get("comm") else ""))
    if r.oom:
        req = r.oom.get("tried_to_allocate")
        out.append(f"[red]OOM[/red] in phase [bold]{escape(str(r.oom['phase']))}[/bold]: tried to allocate "
                   f"{size(req)}, peak reached {size(r.oom['peak_allocated'])}")
    if r.error:
        out.append(Text(r.error.strip().splitlines()[-1], style="red"))
    hidden = [n for n in r.notes if routine(n)] if not verbose else []
    out += [Text(f"note: {n}") for n in r.notes if n not in hidden and n not in priced]
    if hidden:
        out.append(Text(f"({len(hidden)} note{'s' if len(hidden) > 1 else ''} hidden; --verbose)", style="dim"))
    if phases and r.phases:
        t = Table(title="Phases", show_edge=False)
        for col in ("phase", "allocated", "peak", "reserved", "gradients", "optimizer"):
            t.add_column(col, justify="left" if col == "phase" else "right")
        for ph in r.phases:
            t.add_row(escape(ph["phase"]), size(ph["allocated"]), size(ph["peak_allocated"]), size(ph["reserved"]),
                      size(ph["gradients"]), size(ph["optimizer"]))
        out.append(t)
    return out


def print_result(r: Result, console: Console | None = None, phases: bool = False, verbose: bool = False) -> None:
    """Print `result_tables` to `console` (stdout by default)."""
    console = console or Console()
    for item in result_tables(r, phases, verbose):
        console.print(item, soft_wrap=isinstance(item, Text))  # a sentence stays one line, in a pipe too


def json_line(data: Any) -> str:
    """`data` as one line of strict JSON (no NaN or Infinity, which most JSON readers refuse): a float that is
    not finite becomes null, and a row's `notes` say which (a loss that overflowed)."""
    import json
    import math

    found: list[str] = []

    def clean(x: Any, path: str) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            found.append(path)
            return None
        if isinstance(x, dict):
            return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, path) for v in x]
        return x

    cleaned = clean(data, "")
    if found and isinstance(cleaned, dict) and isinstance(cleaned.get("notes"), list):
        what = ", ".join(sorted(set(found)))
        cleaned["notes"].append(f"values that were not finite numbers (NaN or inf: {what}) are recorded as null; "
                                "a loss overflows in pure fp16 training, memory is unaffected")
    return json.dumps(cleaned, allow_nan=False)


def print_max_batch(a: dict[str, Any], target: int | None, console: Console | None = None) -> None:
    """`trainmem max-batch`'s answer in words: the batch, how it was confirmed, the power-of-two cost."""
    console = console or Console()
    if not a["batch"]:
        console.print(f"[red]Not even batch 1 fits {escape(a['model'])} on the {escape(a['gpu'])}[/red] (margin {a['margin']:.0%}); "
                      "`trainmem estimate --batch-size 1 --gpu ...` says what to cut first.")
        return
    tried = ", ".join(f"{b} {'fits' if ok else 'does not'}" for b, ok in a["tried"])
    how = (f"confirmed with {a['trials']} real runs ({tried})" if a["confirmed"] else
           f"from the estimate ({a['estimates']} analytic estimates, {a.get('simulations', 0)} simulations; no CUDA "
           "device here, so no real run)")
    console.print(f"Largest micro-batch for {escape(a['model'])} on the {escape(a['gpu'])}: [bold]{a['batch']}[/bold], "
                  f"{how}.",
                  highlight=False)
    gaps = a.get("not_monotone") or []
    if gaps:
        below = ", ".join(str(g) for g in gaps)
        console.print(f"Memory is not monotone in batch here: {below} {'does' if len(gaps) == 1 else 'do'} not fit while "
                      f"{a['batch']} does (the allocator's block layout at those sizes; `trainmem estimate` says the "
                      "same at each).", highlight=False)
    console.print(f"A power-of-two search (1, 2, 4, ...) would take {a['power_of_two_trials']} real runs and find "
                  f"{a['power_of_two']}.", highlight=False)
    if target:
        micro, accum = a["micro_batch"], a["grad_accum"]
        why = "" if micro == min(a["batch"], target) else (
            f" ({a['batch']} does not divide {target}: {micro} is the largest micro-batch below it that does)")
        console.print(f"Effective batch {target}: --batch-size {micro} --grad-accum {accum}{why}.", highlight=False)


def plan_console(stderr: bool = False) -> Console:
    """The console `trainmem plan` prints to; to a file or a pipe it is at least 110 wide, so that the plan's
    columns are not wrapped."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = max(console.width, 110)
    return console


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    h, rest = divmod(int(round(s)), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def layout(s: TrainSetup) -> str:
    """How a setup spreads over GPUs, in a few words: 8 fsdp, 16 hsdp 2x8, 4 zero3 +opt."""
    shard = "hsdp" if s.hsdp else s.shard
    words = [f"{s.gpus}", shard if s.gpus > 1 else "one GPU"]
    words += [f"{s.nodes}x{s.per_node}"] if s.nodes > 1 else []
    words += [{"optimizer": "+opt off", "params": "+param off"}[s.offload]] if s.offload != "none" else []
    return " ".join(words)


def print_cluster_plan(plan: ClusterPlan, console: Console | None = None) -> None:
    """`trainmem plan --cluster`'s answer: every layout's fastest setups, ranked by step time, with per-rank
    memory, verdict, the step's exposed communication and GPU-hours; which figures are analytic or simulated."""
    console = console or plan_console()
    job = f"; GPU-hours for {plan.job_tokens:,} tokens" if plan.job_tokens else ""
    console.print(f"[bold]{escape(plan.model)} on {escape(plan.cluster)}: global batch {plan.target_batch} x "
                  f"{plan.seq_len} tokens{job}[/bold]", highlight=False)
    console.print(f"{plan.searched} setups estimated, {plan.not_fitting} do not fit; the fastest of each kind per "
                  "layout, fastest step first", highlight=False)
    if plan.options:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        columns = ["#", "GPUs", "micro x accum", "per-rank", "verdict", "step", "comm", "GPU-hours"]
        for col in columns:
            table.add_column(col, justify="left" if col in ("GPUs", "micro x accum", "verdict") else "right",
                             no_wrap=True)
        for i, o in enumerate(plan.options, 1):
            level = "[green]fits[/green]" if o.level == "fits" else "[yellow]tight[/yellow]"
            hours = plan.gpu_hours(o)
            table.add_row(str(i), layout(o.setup), describe(o.setup, ()), _gib(o.need),
                          f"{level} ({'sim' if o.checked == 'simulate' else 'ana'})", f"{o.step_s * 1000:,.0f} ms",
                          f"{plan.comm(o) * 1000:,.0f} ms", "-" if hours is None else f"{hours:,.1f}" if hours >= 10 else f"{hours:.3g}")
        console.print(table)
    else:
        console.print(f"[red]Nothing fits {escape(plan.cluster)}[/red] at global batch {plan.target_batch}.")
    console.print("per-rank: peak reserved + outside the allocator of one rank (ana: the analytic estimate's closed "
                  "forms; sim: the simulated rank, --confirm); step: compute + exposed communication (comm: derived, "
                  "not measured on several GPUs; docs/guide/several-gpus.md)", style="dim", highlight=False)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)


def print_plan(plan: Plan, console: Console | None = None, allow: tuple[str, ...] = ()) -> None:
    """`trainmem plan`'s answer: the ranked table, then the winner's command and TrainingArguments."""
    console = console or plan_console()
    varied = tuple(f for f in ("precision", "optimizer") if f in allow)
    first = plan.options[0].setup if plan.options else None
    fixed = "" if first is None else ", ".join(f"{getattr(first, f)}" for f in ("precision", "optimizer") if f not in varied)
    job = f"; job: {plan.job_tokens:,} tokens" if plan.job_tokens else ""
    console.print(f"[bold]{escape(plan.model)} on the {escape(plan.gpu)}: effective batch {plan.target_batch} x {plan.seq_len} tokens"
                  f"{', ' + fixed if fixed else ''}{job}[/bold]", highlight=False)
    console.print(f"{plan.searched} setups estimated, {plan.not_fitting} do not fit; the fastest of each kind, "
                  "fastest first (predicted: docs/time-model.md)", highlight=False)
    if not plan.options:
        if plan.not_fitting < plan.searched:  # some could not be estimated or timed: the notes say why
            console.print(f"[red]No setup could be ranked on the {escape(plan.gpu)}[/red]; {plan.not_fitting} of "
                          f"{plan.searched} do not fit, and of the rest:", highlight=False)
        else:
            console.print(f"[red]Nothing fits the {escape(plan.gpu)}[/red] at effective batch {plan.target_batch}; "
                          "allow more with --allow peft,optimizer,precision, or pick a bigger card.")
        for note in plan.notes:
            console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    columns = ["#", "micro x accum", "peak", "free", "verdict", "step", "tokens/s", "MFU"] + (["job"] if plan.job_tokens else [])
    for col in columns:
        table.add_column(col, justify="left" if col in ("micro x accum", "verdict") else "right", no_wrap=True)
    for i, o in enumerate(plan.options, 1):
        level = "[green]fits[/green]" if o.level == "fits" else "[yellow]tight[/yellow]"
        row = [str(i), describe(o.setup, varied), _gib(o.need), _gib(o.headroom),
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
    console.print(f"\n[bold]Winner[/bold]: {escape(run_command(plan.model, win.setup))}", highlight=False,
                  soft_wrap=True)
    console.print(training_arguments(win.setup), highlight=False, soft_wrap=True, markup=False)
    if win.level == "tight":
        console.print("[yellow]The winner is tight: less than the margin stays free; the next one down is safer.[/yellow]")
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)


def print_confirmed(setup: TrainSetup, entry: dict[str, Any], console: Console | None = None) -> None:
    """One of `trainmem plan --confirm`'s real runs (a `Plan.confirmed` entry): measured against predicted."""
    console = console or plan_console()
    measured, predicted = entry["measured_step_s"], entry["predicted_step_s"]
    err = f"{entry['error']:+.0%}" if entry["error"] is not None else "-"
    console.print(f"confirmed {describe(setup)} on the {entry['card']}: {entry['status']}, measured "
                  f"{(measured or 0) * 1000:.0f} ms/step, predicted {(predicted or 0) * 1000:.0f} ms ({err})",
                  highlight=False)
