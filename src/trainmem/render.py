"""Terminal rendering of results with rich. Pure presentation: no measurement happens here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .result import Result

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
    from .chapter import find_run

    line = f"{label}: {r.status}, peak_allocated {r.memory['peak_allocated'] / 2**30:.3f} GiB"
    if r.verdict:
        level = r.verdict.get("level") or ("fits" if r.verdict["fits"] else "no")
        line += f"; {r.verdict['gpu']}: {level}, headroom {size(r.verdict['headroom'])}"
    run = find_run(r.setup) if r.model.get("name") == "polyglot-ko-1.3b" else None
    if run is not None:
        line += "; the book's T4: " + ("out of memory" if run.at_first_step_gb is None else "ran")
    return line


def result_tables(r: Result, phases: bool = False) -> list[Any]:
    """A row as the terminal shows it: title, status, the memory at the peak, the seed's figures, throughput,
    verdict, OOM and notes (and, with `phases`, every phase)."""
    s = r.setup
    title = (f"{r.model.get('name')}  batch {s['batch_size']} x accum {s['grad_accum']} "
             f"(effective {r.effective_batch}), seq {s['seq_len']}, {s['peft']}, {s['precision']}, "
             f"{s['optimizer']}{', checkpointing' if s['checkpointing'] else ''}  on {r.env.get('gpu') or s['device']}")
    out: list[Any] = [f"[bold]{title}[/bold]"]
    if r.kind == "estimate":
        out.append(f"estimate ({r.method} method) for one CUDA GPU; the peak is in the {r.peak_phase}")
    else:
        status = {"ok": "[green]ok[/green]", "oom": "[red]out of memory[/red]", "error": "[red]error[/red]"}[r.status]
        cap = f"  (memory capped to {s['gpu']})" if s.get("gpu") else ""
        out.append(f"status: {status}{cap}   steps done: {r.steps_done}/{s['steps']}   peak in {r.peak_phase}")
    mem = Table(title="Memory at the peak", show_edge=False)
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    mem.add_column("size", justify="right")
    m = r.memory
    for key, label in _PARTS:
        mem.add_row(label, f"{m[key]:,}", size(m[key]))
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
    out.append(f"after an optimizer step (the seed's figures): optimizer states {size(ms['optimizer'])}, "
               f"gradients {size(ms['gradients'])}, weights {size(ms['weights'])}")
    tp = r.throughput
    if tp.get("tokens_per_s"):
        out.append(f"throughput: {tp['tokens_per_s']:,.0f} tokens/s, {tp['step_time_s'] * 1000:.1f} ms/step "
                   f"over {tp['timed_steps']} unprobed step(s)")
    if r.time.get("step_s"):
        t = r.time
        out.append(f"predicted time on the {t['card']}: {t['step_s'] * 1000:.1f} ms/step, {t['tokens_per_s']:,.0f} "
                   f"tokens/s, MFU {t['mfu']:.0%}" + (" (derived from its datasheet figures)" if t.get("derived") else ""))
    if r.verdict:
        out.append(verdict_line(r.verdict))
    if r.oom:
        req = r.oom.get("tried_to_allocate")
        out.append(f"[red]OOM[/red] in phase [bold]{r.oom['phase']}[/bold]: tried to allocate {size(req)}, "
                   f"peak reached {size(r.oom['peak_allocated'])}")
    if r.error:
        out.append(f"[red]{r.error.strip().splitlines()[-1]}[/red]")
    for note in r.notes:
        out.append(f"note: {note}")
    if phases and r.phases:
        t = Table(title="Phases", show_edge=False)
        for col in ("phase", "allocated", "peak", "reserved", "gradients", "optimizer"):
            t.add_column(col, justify="left" if col == "phase" else "right")
        for ph in r.phases:
            t.add_row(ph["phase"], size(ph["allocated"]), size(ph["peak_allocated"]), size(ph["reserved"]),
                      size(ph["gradients"]), size(ph["optimizer"]))
        out.append(t)
    return out


def print_result(r: Result, console: Console | None = None, phases: bool = False) -> None:
    """Print `result_tables` to `console` (stdout by default)."""
    console = console or Console()
    for item in result_tables(r, phases):
        console.print(item)


def print_max_batch(a: dict[str, Any], target: int | None, console: Console | None = None) -> None:
    """`trainmem max-batch`'s answer in words: the batch, how it was confirmed, the power-of-two cost."""
    console = console or Console()
    if not a["batch"]:
        console.print(f"[red]Not even batch 1 fits {a['model']} on the {a['gpu']}[/red] (margin {a['margin']:.0%}); "
                      "`trainmem estimate --batch-size 1 --gpu ...` says what to cut first.")
        return
    tried = ", ".join(f"{b} {'fits' if ok else 'does not'}" for b, ok in a["tried"])
    how = (f"confirmed with {a['trials']} real runs ({tried})" if a["confirmed"] else
           f"from the estimate ({a['estimates']} estimates; no CUDA device here, so no real run)")
    console.print(f"Largest micro-batch for {a['model']} on the {a['gpu']}: [bold]{a['batch']}[/bold], {how}.",
                  highlight=False)
    console.print(f"A power-of-two search (1, 2, 4, ...) would take {a['power_of_two_trials']} real runs and find "
                  f"{a['power_of_two']}.", highlight=False)
    if target:
        micro, accum = a["micro_batch"], a["grad_accum"]
        why = "" if micro == min(a["batch"], target) else (
            f" ({a['batch']} does not divide {target}: {micro} is the largest micro-batch below it that does)")
        console.print(f"Effective batch {target}: --batch-size {micro} --grad-accum {accum}{why}.", highlight=False)
