"""The page and its fragments, rendered on the server as HTML strings (every value escaped), so that the
browser only swaps them in and the tests can read them from the test client without a browser.

The bar is an inline SVG: no plotting library on the live path (matplotlib is for the measured-result view,
which reuses `trainmem.report`).
"""

from __future__ import annotations

from html import escape
from typing import Any

from trainmem.config.commands import describe

from .. import GPUS, PRESETS
from .answers import Answer, Row
from .inputs import BOUNDS, CHOICES, DEFAULTS

GiB = 2**30
PARTS = (("weights", "#4e79a7"), ("gradients", "#f28e2b"), ("optimizer", "#e15759"), ("activations", "#76b7b2"),
         ("other", "#59a14f"), ("allocator cache", "#bab0ac"), ("outside the allocator", "#9c755f"))
"""The bar's segments: the five parts at the peak (they add up to peak_allocated), then what the caching
allocator holds beyond it (reserved - allocated), then the memory outside the allocator (context, kernels):
the top of the bar is what the verdict judges against the card's capacity."""


def gib(n: float, signed: bool = False) -> str:
    return f"{n / GiB:+.2f} GiB" if signed else f"{n / GiB:.2f} GiB"


def _options(values: Any, chosen: str) -> str:
    return "".join(f'<option value="{escape(v)}"{" selected" if v == chosen else ""}>{escape(v)}</option>'
                   for v in values)


def form() -> str:
    """The setup form: fields named like `trainmem estimate`'s flags, defaults from the chapter's batch-16 run."""
    d = DEFAULTS

    def number(name: str, label: str) -> str:
        return (f'<label>{label}<input type="number" name="{name}" id="{name}" min="1" max="{BOUNDS[name]}" '
                f'value="{d[name]}"></label>')

    def optional(name: str, label: str, hint: str) -> str:
        return (f'<label>{label}<input type="number" name="{name}" id="{name}" min="1" max="{BOUNDS[name]}" '
                f'value="{d[name]}" placeholder="{hint}"></label>')

    def select(name: str, label: str) -> str:
        return f'<label>{label}<select name="{name}" id="{name}">{_options(CHOICES[name], d[name])}</select></label>'

    cards = "".join(f'<option value="{c.name}"{" selected" if c.name == d["card"] else ""}>{c.name} '
                    f"({c.capacity / GiB:.1f} GiB)</option>" for c in sorted(GPUS.values(), key=lambda c: c.capacity))
    presets = "".join(f'<option value="{escape(p)}">' for p in PRESETS)
    return (
        '<form id="setup" autocomplete="off">'
        '<fieldset><legend>Model</legend>'
        f'<label>Preset or hub id <small>(Enter to look up)</small><input name="model" id="model" list="presets" '
        f'value="{d["model"]}" spellcheck="false" enterkeyhint="go"></label>'
        f'<datalist id="presets">{presets}</datalist>'
        '<label>or a config.json<input type="file" id="config-file" accept=".json,application/json"></label>'
        '<ul id="config-problems" class="problems"></ul></fieldset>'
        f'<fieldset><legend>Card</legend><label>Look at<select name="card" id="card">{cards}</select></label>'
        "</fieldset>"
        '<fieldset><legend>Method</legend>'
        f'{select("peft", "Fine-tuning (none = full)")}{number("lora_r", "LoRA r")}'
        '<label>LoRA targets<input name="lora_targets" id="lora_targets" placeholder="peft default"></label>'
        f'{select("precision", "Precision")}{select("optimizer", "Optimizer")}'
        '<label class="check"><input type="checkbox" name="checkpointing" id="checkpointing" value="on">'
        " Gradient checkpointing</label></fieldset>"
        '<fieldset><legend>Batch</legend>'
        f'{number("batch_size", "Micro-batch")}{number("grad_accum", "Accumulation")}'
        f'{number("seq_len", "Sequence length")}</fieldset>'
        '<fieldset><legend>GPUs <small>(answered per rank)</small></legend>'
        f'{number("gpus", "GPUs (the world size)")}{select("shard", "Sharding")}{select("offload", "Offload")}'
        f'{number("nodes", "Nodes")}{optional("gpus_per_node", "GPUs per node", "GPUs / nodes")}'
        "</fieldset></form>")


def problems(lines: list[str]) -> str:
    """Problems as the CLI prints them: one line each."""
    return "".join(f'<li class="problem">{escape(line)}</li>' for line in lines)


def _css(level: str) -> str:
    return {"can't run": "cannot", "…": "pending", "stopped": "cannot"}.get(level, level)


def about(answer: Answer) -> str:
    """The model and setup an answer is for, in words: the table's caption, so that a table being replaced
    still says what it answers."""
    q, s = answer.query, answer.query.setup
    words = [f"micro-batch {s.batch_size} x {s.grad_accum} accumulation", f"{s.seq_len} tokens",
             "full" if s.peft == "none" else f"{s.peft} r{s.lora_r}", s.precision, s.optimizer]
    words += ["checkpointing"] if s.checkpointing else []
    return f"{q.model}: {', '.join(words)}; {ranks(answer)}"


def ranks(answer: Answer) -> str:
    """One GPU, or which rank of how many the numbers are for."""
    s = answer.query.setup
    if not s.distributed:
        return "one GPU"
    nodes = f", {s.nodes} nodes x {s.per_node} GPUs" if s.nodes > 1 else ""
    hsdp = " (HSDP: sharded within a node, replicated across nodes)" if s.hsdp else ""
    offload = f", {s.offload} offloaded" if s.offload != "none" else ""
    return f"per rank: one rank of {s.gpus} ({s.shard}{offload}{nodes}){hsdp}"


def _verdict(row: Row) -> tuple[str, str, str]:
    """(level, headroom, need) cells of a row."""
    if row.answer is None:
        return ("stopped" if row.stopped else "…"), "", ""
    if isinstance(row.answer, list):
        return "can't run", "", ""
    v = row.answer.verdict(row.card)
    return v["level"], gib(v["headroom"], signed=True), gib(v["need"])


def _ms(t: dict[str, Any] | None) -> str:
    return f"{t['step_s'] * 1000:,.0f} ms" if t else ""


def _per_s(t: dict[str, Any] | None) -> str:
    return f"{t['tokens_per_s']:,.0f}" if t else ""


def _method(row: Row) -> str:
    """The method cell: where the numbers come from, and why not simulated when its simulation stopped."""
    if not row.stopped:
        return row.method
    return (f'{row.method} <span class="badge stopped" title="{escape(row.stopped)}">simulation '
            f'{"timed out" if "stopped after" in row.stopped else "failed"}</span>')


def cards_table(answer: Answer) -> str:
    """Every catalog card, smallest first: verdict and headroom, the largest micro-batch, the predicted time;
    a card that cannot run the setup says why in its row. The caption names the model and setup."""
    body = []
    for row in sorted(answer.rows, key=lambda r: r.card.capacity):
        level, headroom, need = _verdict(row)
        t = row.answer.time if not isinstance(row.answer, (list, type(None))) else None
        chosen = " chosen" if row.card.name == answer.query.card else ""
        mark = ' <span class="badge" title="the smallest card on which this setup fits">smallest that fits</span>' \
            if row.smallest else ""
        why = row.answer if isinstance(row.answer, list) else [row.stopped] if level == "stopped" else None
        cells = (f'<td class="why" colspan="5">{escape("; ".join(why or []))}</td>' if why else
                 f'<td class=num>{headroom}</td><td class=num>{need}</td>'
                 f'<td class=num>{"" if row.max_batch is None else row.max_batch or "none"}</td>'
                 f"<td class=num>{_ms(t)}</td><td class=num>{_per_s(t)}</td>")
        body.append(
            f'<tr class="{_css(level)}{chosen}" data-card="{escape(row.card.name)}" '
            f'data-level="{escape(level)}" data-method="{row.method}"'
            f'{" data-stopped" if row.stopped else ""}>'
            f"<td>{escape(row.card.name)}{mark}</td><td class=num>{row.card.capacity / GiB:.1f} GiB</td>"
            f'<td class="level">{escape(level)}</td>{cells}<td>{_method(row)}</td></tr>')
    s = answer.query.setup
    return (f'<table id="cards-table" data-batch="{s.batch_size}" data-card="{escape(answer.query.card)}" '
            f'data-model="{escape(answer.query.model)}" data-ranks="{s.gpus}">'
            f'<caption>{escape(about(answer))}</caption>'
            "<thead><tr><th>card</th><th>memory</th><th>verdict</th><th>headroom</th><th>needs</th>"
            '<th title="analytic estimate, as trainmem max-batch searches it">largest micro-batch</th>'
            "<th>step (predicted)</th><th>tokens/s</th><th>method</th></tr></thead>"
            f'<tbody>{"".join(body)}</tbody></table>')


def status(answer: Answer) -> str:
    """Which method the numbers come from, and what is still running."""
    done = answer.groups - answer.pending
    if not answer.groups:
        sim = "analytic only for this setup (ZeRO, DDP and offload are modelled analytically)"
    elif answer.pending:
        sim = (f'<span class="spinner"></span> simulating: {done} of {answer.groups} runtime groups done; '
               "rows marked analytic are swapped for simulated ones as their group finishes")
    else:
        sim = (f"simulated: {answer.groups} runtime groups (one simulated step each, every card replayed under "
               "its own cap)")
    if answer.timed_out:
        sim += (f'; <b class="stopped">the simulation of {answer.timed_out} runtime group'
                f'{"s" if answer.timed_out > 1 else ""} ran past its time limit</b>: its rows show the analytic '
                f'answer, marked <button id="retry" type="button" class="retry">retry with '
                f'{answer.retry_limit:g} s</button>')
    return f'{sim} (server: {answer.seconds * 1000:,.0f} ms)'


def waiting(what: str) -> str:
    """The status while a lookup or a new setup's first answer is worked out (the table shown is greyed)."""
    return f'<span class="spinner"></span> {escape(what)}…'



def breakdown(answer: Answer) -> str:
    """The chosen card: the parts at the peak as a stacked bar against its capacity, the verdict, the notes."""
    row = answer.chosen
    card = row.card
    rank = f"one rank of {answer.query.setup.gpus}, " if answer.query.setup.distributed else ""
    head = f'<h2>On the {escape(card.name)} <small>({rank}{row.method})</small></h2>'
    if row.stopped:
        head += f'<p class="stopped">{escape(row.stopped)}: the numbers below are the analytic estimate</p>' \
            if row.answer is not None else ""
    if row.answer is None:
        return head + (f'<ul class="problems">{problems([row.stopped])}</ul>' if row.stopped else "<p>simulating…</p>")
    if isinstance(row.answer, list):
        return head + f'<ul class="problems">{problems(row.answer)}</ul>'
    b = row.answer
    v = b.verdict(card)
    m = b.memory
    sizes = [m[k] for k in ("weights", "gradients", "optimizer", "activations", "other")]
    sizes += [max(0, m["peak_reserved"] - m["peak_allocated"]), max(0, v["need"] - m["peak_reserved"])]
    scale = 760.0 / max(card.capacity, v["need"]) / 1.04
    x, rects, legend = 0.0, [], []
    for (name, colour), size in zip(PARTS, sizes, strict=True):
        w = size * scale
        rects.append(f'<rect x="{x:.1f}" y="20" width="{w:.1f}" height="40" fill="{colour}">'
                     f"<title>{name}: {gib(size)}</title></rect>")
        legend.append(f'<li><span class="swatch" style="background:{colour}"></span>{name} <b>{gib(size)}</b></li>')
        x += w
    cap = card.capacity * scale
    budget = card.budget(v["margin"]) * scale
    svg = (f'<svg id="bar" viewBox="0 0 800 90" role="img" aria-label="memory at the peak on the {escape(card.name)}">'
           f'{"".join(rects)}<line x1="{cap:.1f}" x2="{cap:.1f}" y1="8" y2="72" stroke="#d62728" stroke-width="2"/>'
           f'<text x="{min(cap, 700):.1f}" y="86" font-size="11">{escape(card.name)} {gib(card.capacity)}</text>'
           f'<line x1="{budget:.1f}" x2="{budget:.1f}" y1="14" y2="66" stroke="#d62728" stroke-dasharray="3 3"/>'
           f'<text x="2" y="12" font-size="11">peak phase: {escape(b.peak_phase)}</text></svg>')
    words = {"fits": "fits", "tight": "fits with less than the margin free", "no": "does not fit"}[v["level"]]
    t = b.time or {}
    timing = (f"; predicted step {t['step_s'] * 1000:,.0f} ms, {t['tokens_per_s']:,.0f} tokens/s, MFU {t['mfu']:.0%}"
              if t else "")
    advice = f'<p class="advice">cut first: {escape(v["advice"])}</p>' if v["level"] != "fits" else ""
    notes = "".join(f"<li>{escape(n)}</li>" for n in b.notes)
    said = b.disagreement(card)
    return (f'<div id="chosen" data-card="{escape(card.name)}" data-level="{v["level"]}" '
            f'data-method="{row.method}">{head}'
            f'<p class="verdict {v["level"]}"><b>{words}</b>: needs {gib(v["need"])} of {gib(card.capacity)} '
            f'(headroom {gib(v["headroom"], signed=True)} within a {v["margin"]:.0%} margin){timing}</p>{svg}'
            f'<ul class="legend">{"".join(legend)}<li class="dim">red line: the card\'s capacity; dashed: less the '
            f'{v["margin"]:.0%} margin</li></ul>{advice}'
            + (f'<p class="disagree">{escape(said)}</p>' if said else "")
            + f'<details><summary>notes ({len(b.notes)})</summary><ul>{notes}</ul></details></div>')


def plan(found: dict[str, Any]) -> str:
    """`trainmem plan`'s answer: the ranked table, the winner's command and TrainingArguments."""
    head = (f"<p>{escape(found['model'])} on the {escape(found['gpu'])}: effective batch {found['target_batch']} x "
            f"{found['seq_len']} tokens; {found['searched']} setups estimated, {found['not_fitting']} do not fit; "
            "the fastest of each kind, fastest first.</p>")
    if not found["options"]:
        return head + '<p class="no">Nothing fits: allow more, or pick a bigger card.</p>'
    rows = []
    for i, o in enumerate(found["options"], 1):
        from .. import TrainSetup

        s = TrainSetup.from_dict(o["setup"])
        rows.append(f"<tr><td>{i}</td><td>{escape(describe(s, ()))}</td><td class=num>{gib(o['need'])}</td>"
                    f"<td class=num>{gib(o['headroom'])}</td><td>{o['level']} ({o['checked'][:3]})</td>"
                    f"<td class=num>{o['step_s'] * 1000:,.0f} ms</td><td class=num>{o['tokens_per_s']:,.0f}</td>"
                    f"<td class=num>{o['mfu']:.0%}</td></tr>")
    win = found["options"][0]
    dropped = "".join(f"<li>dropped {escape(describe(TrainSetup.from_dict(d['setup']), ()))}: analytic said "
                      f"{d['analytic']}, simulate says {d['simulate']}</li>" for d in found["dropped"])
    notes = "".join(f"<li>{escape(n)}</li>" for n in found["notes"])
    return (head + '<table id="plan-table"><thead><tr><th>#</th><th>micro x accum</th><th>peak</th><th>free</th>'
            "<th>verdict</th><th>step</th><th>tokens/s</th><th>MFU</th></tr></thead>"
            f'<tbody>{"".join(rows)}</tbody></table>'
            '<p class="dim">peak: reserved + outside the allocator; free: within the margin; sim/ana: the method of '
            "the verdict</p>"
            f'<h3>Winner</h3><pre id="winner-command">{escape(win["command"])}</pre>'
            f'<pre id="winner-args">{escape(win["training_arguments"])}</pre><ul>{dropped}{notes}</ul>')


def _phase_label(phase: str) -> str:
    """`step2.micro1.backward` -> `2.1 bwd`, `step1.optimizer` -> `1 opt`: short enough to sit under a bar."""
    words = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
    parts = [p.removeprefix("step").removeprefix("micro") for p in phase.split(".")]
    numbers = ".".join(p for p in parts if p.isdigit())
    return " ".join([numbers] + [words.get(p, p) for p in parts if not p.isdigit()]).strip()


def timeline(rows: list[dict[str, Any]]) -> str:
    """The phases of the first measured row that has them: allocated and reserved at each phase's peak."""
    row = next((r for r in rows if r.get("phases")), None)
    if row is None:
        return ""
    phases = row["phases"][:40]
    top = max(max(p.get("peak_reserved") or 0, p.get("peak_allocated") or 0) for p in phases) or 1
    step, bars = 760 / len(phases), []
    for i, p in enumerate(phases):
        for j, (key, colour) in enumerate((("peak_allocated", "#4e79a7"), ("peak_reserved", "#bab0ac"))):
            h = (p.get(key) or 0) / top * 130
            bars.append(f'<rect x="{20 + i * step + j * step / 2.4:.1f}" y="{140 - h:.1f}" width="{step / 2.6:.1f}" '
                        f'height="{h:.1f}" fill="{colour}"><title>{escape(p["phase"])} {key}: {gib(p.get(key) or 0)}'
                        "</title></rect>")
        bars.append(f'<text x="{20 + (i + 0.4) * step:.1f}" y="156" font-size="10" text-anchor="middle">'
                    f'{escape(_phase_label(p["phase"]))}</text>')
    s = row["setup"]
    label = f"{row['model'].get('name', '')} b{s.get('batch_size')} x{s.get('grad_accum')} {s.get('peft')}"
    return (f'<figure id="timeline"><figcaption>Phase timeline of the first measured row ({escape(label)}): the peak '
            f"allocated (blue) and reserved (grey) bytes in each phase, up to {gib(top)}</figcaption>"
            f'<svg viewBox="0 0 800 165" role="img">{"".join(bars)}</svg></figure>')


def page() -> str:
    """The whole page: the form, then the live answer's places, the plan and the measured-result view."""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1"><title>trainmem: will this fine-tuning fit?</title>
<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/serve.css"></head><body>
<header><h1>trainmem <small>will this fine-tuning fit, on which card, how fast?</small></h1>
<p>Every number comes from the trainmem library: the analytic estimate at once, the simulation of the real
Hugging Face model's step on the meta device in the background (each row says which). Presets and hub configs
only: no weights are downloaded.</p></header>
<main>{form()}
<section id="answer"><p id="status" class="dim">…</p><ul id="problems" class="problems"></ul>
<p id="replacing" class="replacing" hidden></p>
<div id="cards"></div><div id="breakdown"></div>
<p><a id="download" href="/api/result.json" download>Download the JSON</a></p></section>
<section id="plan"><h2>Plan: the fastest setup that fits the chosen card</h2>
<form id="plan-form"><label>Effective batch<input type="number" id="target" name="target"
min="1" max="{BOUNDS["target"]}" value="16"></label>
<label class="check"><input type="checkbox" name="allow" value="checkpointing" checked> checkpointing</label>
<label class="check"><input type="checkbox" name="allow" value="peft" checked> LoRA / QLoRA</label>
<label class="check"><input type="checkbox" name="allow" value="optimizer"> optimizer</label>
<label class="check"><input type="checkbox" name="allow" value="precision"> precision</label>
<button id="plan-button" type="button">Plan</button> <span id="plan-progress"></span></form>
<div id="plan-result"></div></section>
<section id="measured"><h2>Measured results</h2><p>A <code>trainmem run --out</code> or <code>trainmem sweep
--out</code> JSONL file: the report's table and plots (<code>trainmem report</code>).</p>
<label>JSONL<input type="file" id="rows-file" accept=".jsonl,.json,.txt"></label>
<ul id="report-problems" class="problems"></ul><div id="report-timeline"></div>
<iframe id="report" title="trainmem report" sandbox="allow-scripts" hidden></iframe></section></main>
<footer class="dim">trainmem serve: estimates for one CUDA GPU per rank, as <code>trainmem estimate --gpu CARD</code>
(with <code>--gpus N --shard S --nodes M</code>: one rank of N) gives them; cards are the catalog's (docs/cards.md), times the step-time model's (docs/time-model.md).</footer>
<script src="/static/serve.js"></script></body></html>"""


__all__ = ["page", "form", "cards_table", "breakdown", "status", "waiting", "about", "plan", "problems", "timeline"]
