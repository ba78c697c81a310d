"""The tables and figures docs/ and the README quote, rendered from the code and the committed tables.

A generated block sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->` in a markdown file;
`BLOCKS` says which function renders it. Nothing there is typed by hand, so a changed constant, card or
error table changes the docs in the same commit, and tests/regression/test_docs.py fails until it does:

- `time-constants`, `card-speeds` (docs/time-model.md): the step-time model's constants, read from
  its module's source with each constant's docstring, and the catalog's speed figures;
- `catalog` (docs/cards.md), `card-names` (README.md): the card catalog and the names `--gpu` takes;
- `held-out`, `today` (docs/accuracy.md), `readme-accuracy` (README.md): the memory estimator's errors,
  from the error tables in docs/data/ (today's estimator) and docs/lab/data/ (each held-out set at the
  commit it was reported at, `manifest.reports`), and the step-time model's held-out errors, from the tables
  kept as reported (`manifest.time_reports`) and docs/data/time-in-sample.md.

`refresh` rewrites or checks every block (`python benchmarks/docs_tables.py [--check]`). Reads no GPU and runs
no estimate: a few seconds.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import statistics
from collections.abc import Callable
from types import ModuleType

from trainmem.config.optimizers import OPTIMIZERS as OPTIMIZER_TABLE
from trainmem.estimator.time import step as timing_model
from trainmem.hardware import gpus as cards

from . import manifest, repository


def _data(*parts: str) -> str:
    """A path under docs/data: the tables regenerated at today's code."""
    return str(repository.docs("data", *parts))


def _lab(*parts: str) -> str:
    """A path under docs/lab: the dated measurements, and tables kept as reported."""
    return str(repository.docs("lab", *parts))


GiB, MiB = 1024**3, 1024**2


# --- the step-time model's constants ------------------------------------------------------------------------
def _constants(module: ModuleType) -> list[tuple[str, str, str]]:
    """(name, value as written, docstring) of every upper-case module constant followed by a docstring."""
    tree = ast.parse(inspect.getsource(module))
    source = inspect.getsource(module)
    out = []
    for node, after in zip(tree.body, tree.body[1:]):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.isupper() and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            value = " ".join(ast.get_source_segment(source, node.value).split())
            out.append((node.targets[0].id, value, " ".join(after.value.value.split())))
    return out


def _first_sentence(doc: str) -> str:
    """The docstring's first sentence (a period followed by a space, outside parentheses), cut at its first
    colon outside parentheses where it runs over 160 characters."""
    depth = 0
    for i, c in enumerate(doc):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "." and depth == 0 and (i + 1 == len(doc) or doc[i + 1] == " "):
            doc = doc[:i + 1]
            break
    if len(doc) > 160:
        depth = 0
        for i, c in enumerate(doc):
            depth += c in "([{"
            depth -= c in ")]}"
            if c == ":" and depth == 0:
                return doc[:i] + "."
    return doc


def _cell(text: str) -> str:
    """Text safe in a markdown table cell."""
    return text.replace("|", "\\|")


def time_constants() -> str:
    """The step-time model's constants (fitted first), each with the first sentence of its docstring."""
    timing = timing_model
    fitted = set(timing.FITTED)
    lines = ["| constant | value | fitted or fixed | meaning |", "|---|---|---|---|"]
    rows = _constants(timing)
    for name, value, doc in sorted(rows, key=lambda r: r[0] not in fitted):
        kind = "fitted" if name in fitted else "fixed"
        lines.append(f"| `{name}` | `{_cell(value)}` | {kind} | {_cell(_first_sentence(doc))} |")
    missing = fitted - {r[0] for r in rows}
    if missing:
        raise ValueError(f"fitted constants without a docstring: {sorted(missing)}")
    return "\n".join(lines)


def optimizers() -> str:
    """Each optimizer's row of `config.optimizers`: what it keeps, what its step moves and launches."""
    lines = ["| `--optimizer` | `TrainingArguments.optim` | keeps | state bytes of a 4096 x 4096 bf16 matrix "
             "| step passes (bytes per trained byte) | host launches per tensor |", "|---|---|---|---:|---:|---:|"]
    for o in OPTIMIZER_TABLE.values():
        state = o.state_bytes(4096 * 4096, (4096, 4096), 2)
        passes = "8-bit kernel (`BYTES_8BIT`)" if o.eight_bit else f"{o.passes:g}"
        lines.append(f"| `{o.name}` | `{o.trainer}` | {_cell(o.help)} | {state:,} | {passes} | {o.per_tensor:g} |")
    return "\n".join(lines)


def card_speeds() -> str:
    """The catalog's speed figures, each card's with its source."""
    lines = ["| card | fp16/bf16 tensor TFLOPS (dense) | fp32 TFLOPS | TF32 TFLOPS (dense) | memory GB/s "
             "| host link GB/s | source |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, s in cards.SPEEDS.items():
        tf32 = "-" if s.tf32_tflops is None else f"{s.tf32_tflops:g}"
        lines.append(f"| {name} | {s.half_tflops:g} | {s.fp32_tflops:g} | {tf32} | {s.bandwidth_gbs:g} "
                     f"| {s.pcie_gbs:g} | {_cell(s.source)} |")
    return "\n".join(lines)


# --- the card catalog ---------------------------------------------------------------------------------------
def catalog() -> str:
    """The card catalog: what each card's estimate assumes."""
    lines = ["| card | also matches | capacity GiB | compute capability | SMs | bf16 | SDPA kernel (half / fp32) "
             "| cuBLAS workspace per handle | outside the allocator | runtime figures |",
             "|---|---|---:|---|---:|---|---|---|---:|---|"]
    for g in cards.CATALOG.values():
        half = "flash" if g.flash else "memory-efficient"
        ws = g.cublas_workspace
        workspace = f"{ws // MiB} MiB" + (f" + {(ws % MiB) // 1024} KiB" if ws % MiB else "")
        aliases = ", ".join(g.aliases) or "-"
        lines.append(f"| {g.name} | {aliases} | {g.capacity / GiB:.2f} | sm{g.sm[0]}{g.sm[1]} ({g.architecture}) "
                     f"| {g.sms} | {'yes' if g.bf16 else 'no'} | {half} / memory-efficient | {workspace} "
                     f"| {g.context / MiB:.0f} MiB | {'measured' if g.measured else 'derived'} |")
    return "\n".join(lines)


def card_names() -> str:
    """The names `--gpu` takes."""
    return ", ".join(f"`{name}`" for name in cards.CATALOG) + "."


# --- the memory estimator's errors --------------------------------------------------------------------------
class Table:
    """One error table of benchmarks/compare_estimates.py: its setups, its summary lines and its verdicts."""

    def __init__(self, path: str) -> None:
        self.path = path
        text = open(path).read()
        first = text[text.index("| setup |"):].split("\n\n", 1)[0].splitlines()[2:]
        self.setups = len(first)
        self.summary = {m.group(1): (int(m.group(2)), float(m.group(3)), float(m.group(4)))
                        for m in re.finditer(r"^\| ([a-z0-9() ]+) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \|$", text, re.M)}
        self.rows = [[c.strip() for c in line.strip("|").split("|")] for line in first]
        """The setups' rows: label, measured peak, phase, analytic, simulate, auto, reserved, device, ..."""
        self.verdict_rows = [[c.strip() for c in m.group(0).strip("|").split("|")]
                             for m in re.finditer(r"^\|.*\| (right|WRONG) \|$", text, re.M)]
        """Near-capacity rows: label, card, measured under the cap, the verdict, right or WRONG."""
        self.right = sum(r[-1] == "right" for r in self.verdict_rows)
        self.verdicts = len(self.verdict_rows)

    @property
    def trained(self) -> int:
        """Setups counted in the `auto` summary line: those that trained (the others ran out of memory)."""
        return self.summary["auto"][0]

    def figure(self, key: str) -> str:
        """`median% / worst%` of one summary line (`auto`, `reserved`, `device`, `analytic`)."""
        _, median, worst = self.summary[key]
        return f"{median:.2f}% / {worst:.2f}%"

    def verdict_cell(self) -> str:
        """`right of runs` of the near-capacity verdicts, `-` where the table has none."""
        return f"{self.right} of {self.verdicts}" if self.verdicts else "-"


def held_out() -> str:
    """Each held-out set at the commit it was reported at (`manifest.reports`)."""
    lines = ["| set | card | reported at | setups (trained) | `peak_allocated` median / worst | `peak_reserved` "
             "median / worst | `device_used` median / worst | near-capacity verdicts right |",
             "|---|---|---|---|---|---|---|---|"]
    reported = manifest.reports()
    for name, r in reported:
        t = Table(_lab("data", r["table"]))
        label = name + (f", rows {r['rows']}" if "rows" in r else "")
        lines.append(f"| [{label}](lab/data/{r['table']}) | {manifest.gpu(name)} | {r['at']} | {t.setups} "
                     f"({t.trained}) | {t.figure('auto')} | {t.figure('reserved')} | {t.figure('device')} "
                     f"| {t.verdict_cell()} |")
    missing = sorted(manifest.number(s) for s in manifest.memory_sets() if s != "in-sample"
                     and s not in {name for name, _ in reported})
    lines.append("")
    names = " and ".join(", ".join(str(n) for n in missing).rsplit(", ", 1))
    lines.append(f"Held-out {names}: no table at report time was kept (their figures then are in the lab notes "
                 "only); they are in the table of today's estimator below.")
    return "\n".join(lines)


def today() -> str:
    """Every set at the committed estimator (docs/data/errors-*.md): in-sample, all of them."""
    lines = ["| set | card | setups (trained) | `peak_allocated` median / worst | `peak_reserved` median / worst "
             "| `device_used` median / worst | analytic `peak_allocated` median / worst "
             "| near-capacity verdicts right |", "|---|---|---|---|---|---|---|---|"]
    for name in sorted(manifest.memory_sets(), key=manifest.number):
        f = f"errors-{name.replace(' ', '-')}.md"
        t = Table(_data(f))
        lines.append(f"| [{name}](data/{f}) | {manifest.gpu(name)} | {t.setups} ({t.trained}) | {t.figure('auto')} "
                     f"| {t.figure('reserved')} | {t.figure('device')} | {t.figure('analytic')} "
                     f"| {t.verdict_cell()} |")
    return "\n".join(lines)


def verdict_levels() -> str:
    """How each verdict level fared on the held-out near-capacity runs, each set at the commit it was reported
    at: what `tight` has meant."""
    counts = {level: [0, 0] for level in ("fits", "tight", "no")}
    for _, r in manifest.reports():
        for row in Table(_lab("data", r["table"])).verdict_rows:
            counts[row[3].split()[0]][row[2].startswith("oom")] += 1
    lines = ["| verdict | runs | trained | ran out of memory |", "|---|---:|---:|---:|"]
    for level, (ran, oom) in counts.items():
        lines.append(f"| `{level}` | {ran + oom} | {ran} | {oom} |")
    return "\n".join(lines)


def misses() -> str:
    """Today's misses, from the error tables of docs/data: rows whose `peak_allocated` is off by more than 1%
    or whose `peak_reserved` is off by more than 5%, and near-capacity verdicts the tables count wrong."""
    lines = ["| set | setup | `peak_allocated` | `peak_reserved` | `device_used` |", "|---|---|---:|---:|---:|"]
    wrong = ["| set | setup | card | measured under the cap | verdict |", "|---|---|---|---|---|"]
    for name in sorted(manifest.memory_sets(), key=manifest.number):
        t = Table(_data(f"errors-{name.replace(' ', '-')}.md"))
        for r in t.rows:
            if not r[5].endswith("%"):
                continue
            allocated, reserved = float(r[5].rstrip("%")), float(r[6].split("%")[0])
            if abs(allocated) > 1 or abs(reserved) > 5:
                lines.append(f"| {name} | {r[0]} | {r[5]} | {r[6].split()[0]} | {r[7]} |")
        for r in t.verdict_rows:
            if r[-1] == "WRONG":
                wrong.append(f"| {name} | {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
    return "\n".join(lines + [""] + wrong)


def sharded() -> str:
    """One FSDP2 rank emulated on one GPU: held out (docs/lab/data/errors-sharded.md, at the commit the runs
    were measured against) and today (docs/data/errors-sharded-now.md)."""
    def summary(path: str) -> dict[str, tuple[int, str, str]]:
        text = open(path).read()
        return {m.group(1): (int(m.group(2)), m.group(3), m.group(4))
                for m in re.finditer(r"^\| ([a-z_ ]+) \| (\d+) \| ([\d.]+%) \| ([\d.]+%) \|$", text, re.M)}
    held = [(name, report, summary(_lab("data", report["table"]))) for name, report in manifest.sharded_reports()]
    now = summary(_data("errors-sharded-now.md"))
    head = " | ".join(f"{name} ({next(iter(t.values()))[0]} ranks, at {r['at']}): median / worst" for name, r, t in held)
    lines = [f"| figure | {head} | {held[0][0]}'s ranks today (in-sample): median / worst |",
             "|---|" + "---|" * (len(held) + 1)]
    for key in held[0][2]:
        cells = " | ".join(f"{t[key][1]} / {t[key][2]}" if key in t else "-" for _, _, t in held)
        lines.append(f"| {key} | {cells} | {now[key][1]} / {now[key][2]} |")
    return "\n".join(lines)


# --- the step-time model's errors ---------------------------------------------------------------------------
TIME_ROW = re.compile(r"^\| .+? \| ([\d.]+) \| ([\d.]+) \| [+-]\d+% \|$", re.M)
"""A row of a step-time table: setup, measured ms, predicted ms, error."""
TIME_SUMMARY = re.compile(r"^(?:in-sample|held out): (\d+) rows, median \|error\| ([\d.]+)%, worst ([\d.]+)%", re.M)
"""A step-time table's summary line, computed from unrounded times."""


def time_rows(path: str) -> list[tuple[float, float]]:
    """(measured, predicted) milliseconds of each row of a step-time table, as printed (0.1 ms)."""
    return [(float(m.group(1)), float(m.group(2))) for m in TIME_ROW.finditer(open(path).read())]


def time_summary(path: str) -> tuple[int, float, float]:
    """Rows, median % and worst % of a step-time table, as its summary line reports them."""
    m = TIME_SUMMARY.search(open(path).read())
    return int(m.group(1)), float(m.group(2)), float(m.group(3))


def errors(rows: list[tuple[float, float]]) -> tuple[int, float, float]:
    """Rows, median and worst absolute relative error in % of (measured, predicted) pairs."""
    errs = [abs(p - m) / m for m, p in rows]
    return len(errs), 100 * statistics.median(errs), 100 * max(errs)


def time_tables() -> list[tuple[str, str]]:
    """(card, path) of each held-out step-time table kept as reported (`manifest.time_reports`)."""
    return [(card, _lab("data", r["table"])) for card, r in manifest.time_reports()]


def time_held_out() -> list[tuple[str, int, float, float]]:
    """(card, rows, median %, worst %) of each held-out step-time set, as its summary line reports them
    (tests/regression/test_docs.py recomputes them from the printed rows)."""
    return [(card, *time_summary(path)) for card, path in time_tables()]


def time_in_sample_rows() -> list[tuple[float, float]]:
    """(measured, predicted) milliseconds of each row of docs/data/time-in-sample.md, as printed."""
    return time_rows(_data("time-in-sample.md"))


def time_in_sample() -> tuple[int, float, float]:
    """Rows, median % and worst % of docs/data/time-in-sample.md, as its summary line reports them."""
    return time_summary(_data("time-in-sample.md"))


def time_accuracy() -> str:
    """The step-time model's errors: each held-out set, then the in-sample table's summary."""
    lines = ["| rows | card | median abs error | worst abs error |", "|---|---|---|---|"]
    for card, n, median, worst in time_held_out():
        lines.append(f"| {n}, held out | {card} | {median:.1f}% | {worst:.1f}% |")
    n, median, worst = time_in_sample()
    lines.append(f"| {n}, in-sample ([table](data/time-in-sample.md)) | H200 | {median:.1f}% | {worst:.1f}% |")
    return "\n".join(lines)


def readme_accuracy() -> str:
    """The README's accuracy sentence: the held-out memory sets as reported and the held-out step times."""
    kept = manifest.reports()
    held = [Table(_lab("data", r["table"])) for _, r in kept]
    medians = [t.summary["auto"][1] for t in held]
    worsts = [t.summary["auto"][2] for t in held]
    right, verdicts = sum(t.right for t in held), sum(t.verdicts for t in held)
    timed = time_held_out()
    cards = " and ".join(dict.fromkeys(card for card, *_ in timed))
    return (f"Memory, on {len({n for n, _ in kept})} such sets as reported: `peak_allocated` off by "
            f"{min(medians):.2f}-{max(medians):.2f}% at each set's median and {min(worsts):.2f}-{max(worsts):.2f}% "
            f"at its worst; the verdict right on {right} of {verdicts} runs capped to a smaller card near its "
            f"capacity. Step time, on {len(timed)} sets measured after its constants were fitted ("
            f"{sum(n for _, n, *_ in timed)} runs on the {cards}, every card but the H200 predicted from its "
            f"datasheet figures): {min(m for *_, m, _ in timed):.1f}-{max(m for *_, m, _ in timed):.1f}% at each "
            f"set's median, {min(w for *_, w in timed):.1f}-{max(w for *_, w in timed):.1f}% at its worst.")


BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "time-constants": ("docs/time-model.md", time_constants),
    "card-speeds": ("docs/time-model.md", card_speeds),
    "optimizers": ("docs/time-model.md", optimizers),
    "time-accuracy": ("docs/accuracy.md", time_accuracy),
    "catalog": ("docs/cards.md", catalog),
    "card-names": ("README.md", card_names),
    "held-out": ("docs/accuracy.md", held_out),
    "today": ("docs/accuracy.md", today),
    "verdict-levels": ("docs/accuracy.md", verdict_levels),
    "misses": ("docs/accuracy.md", misses),
    "sharded": ("docs/accuracy.md", sharded),
    "readme-accuracy": ("README.md", readme_accuracy),
}
"""Block name -> (the file it is in, what renders it)."""


def _span(text: str, name: str) -> tuple[int, int]:
    start, end = f"<!-- generated: {name} -->\n", f"\n<!-- end: {name} -->"
    i = text.index(start) + len(start)
    return i, text.index(end, i)


def block(path: str, name: str) -> str:
    """The block `name` as it stands in `path` (relative to the repository root)."""
    text = open(repository.root() / path).read()
    i, j = _span(text, name)
    return text[i:j]


def write(path: str, name: str, rendered: str) -> None:
    """Replace the block `name` of `path` (relative to the repository root) with `rendered`."""
    full = repository.root() / path
    text = open(full).read()
    i, j = _span(text, name)
    with open(full, "w") as f:
        f.write(text[:i] + rendered + text[j:])


def refresh(rewrite: bool = True) -> list[str]:
    """Render every block of `BLOCKS`; rewrite in place those that differ from their file (unless `rewrite` is
    False, a check) and return them as `FILE: NAME`."""
    stale = []
    for name, (path, render) in BLOCKS.items():
        now = render()
        if block(path, name) != now:
            stale.append(f"{path}: {name}")
            if rewrite:
                write(path, name, now)
    return stale
