"""PNG plots of result rows with matplotlib's object API (no pyplot: no global state, no display).

- `breakdown.png`: the five parts at the peak, stacked, then the allocator's cache (reserved - allocated) and
  the memory outside the allocator (context, kernels): the bar's top is what the verdict judges against
  each card's capacity;
- `batch.png`: peak_allocated against the micro-batch, a line per method and otherwise-equal setup;
- `throughput.png`: peak_allocated against tokens/s for the measured rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainmem.hardware.gpus import find_gpu

from .tables import GiB, label, setup_key

PARTS = ("weights", "gradients", "optimizer", "activations", "other")
MISSING = "matplotlib is not installed: pip install 'trainmem[report]' for the plots"


def available() -> bool:
    """Whether matplotlib is installed: plots are optional (`trainmem[report]`), tables are not."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _figure(width: float = 9, height: float = 5) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _kind(row: dict[str, Any]) -> str:
    return "measured" if row["kind"] == "measurement" else f"estimate ({row.get('method')})"


def _cache(row: dict[str, Any]) -> float:
    m = row["memory"]
    return max(0, (m.get("peak_reserved") or 0) - m["peak_allocated"]) / GiB


def _outside(row: dict[str, Any]) -> float:
    """What lies outside the allocator on the card the row is judged on: under `--gpu CARD` that card's
    (a capped run's device_used is the host card's, other processes on it included), else device_used -
    peak_reserved on CUDA (a CPU run's device_used is its RSS: nothing to add)."""
    s, m = row["setup"], row["memory"]
    card = find_gpu(s["gpu"]) if s.get("gpu") else None
    if card is not None:
        return card.overhead(s.get("attention", "sdpa"), s.get("precision", "fp16"), s.get("peft", "none")) / GiB
    if s.get("device") != "cuda" or not m.get("device_used") or not m.get("peak_reserved"):
        return 0.0
    return max(0, m["device_used"] - m["peak_reserved"]) / GiB


def breakdown(rows: list[dict[str, Any]], path: Path, gpu: str | None = None) -> Path:
    """Stacked parts per setup; lines at the capacity of `gpu` and of every card the setups name."""
    shown = [r for r in rows if r["status"] in ("ok", "skipped") and r["memory"]["peak_allocated"]]
    shown.sort(key=lambda r: (setup_key(r), r["kind"]))
    fig = _figure(max(6, 0.55 * len(shown) + 3), 5.5)
    ax = fig.add_subplot()
    x = range(len(shown))
    bottom = [0.0] * len(shown)
    for part in PARTS:
        height = [r["memory"][part] / GiB for r in shown]
        ax.bar(x, height, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, height)]
    # an OOM is reserved + what lies outside the allocator against the capacity, so the bars show those too
    for name, height in (("allocator cache (reserved - allocated)", [_cache(r) for r in shown]),
                         ("outside the allocator (context, kernels)", [_outside(r) for r in shown])):
        ax.bar(x, height, bottom=bottom, label=name, color="lightgray" if "cache" in name else "dimgray",
               hatch="//" if "cache" in name else None)
        bottom = [b + h for b, h in zip(bottom, height)]
    cards = {c for c in [gpu, *(r["setup"].get("gpu") for r in shown)] if c and find_gpu(c)}
    for name in sorted(cards):
        card = find_gpu(name)
        ax.axhline(card.capacity / GiB, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"{card.name} capacity", (0, card.capacity / GiB), textcoords="offset points", xytext=(2, 3),
                    fontsize=8)
    ax.set_xticks(list(x), [f"{label(r)}\n{'M' if r['kind'] == 'measurement' else 'E'}" for r in shown],
                  rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GiB at the peak")
    ax.set_title("Memory at the peak\n(the top of a bar is what fits or not; M = measured, E = estimated)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, bbox_inches="tight")  # the legend sits outside the axes: keep it in the picture
    return path


def batch(rows: list[dict[str, Any]], path: Path) -> Path:
    """peak_allocated vs micro-batch; setups equal but for the batch share a line, one per method."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        rest = {k: v for k, v in r["setup"].items() if k not in ("batch_size", "device", "gpu")}
        rest_label = label({"setup": {**rest, "batch_size": "*"}}).removeprefix("b* ")
        key = (f"{_kind(r)} {r['model']['name']} {rest_label}", str(sorted(rest.items())))
        series.setdefault(key, []).append((r["setup"]["batch_size"], r["memory"]["peak_allocated"] / GiB))
    fig = _figure()
    ax = fig.add_subplot()
    for (name, _), points in series.items():
        points = sorted(set(points))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("peak_allocated (GiB)")
    ax.set_title("Memory vs batch size")
    ax.legend(fontsize=7)
    fig.savefig(path)
    return path


def throughput(rows: list[dict[str, Any]], path: Path) -> Path:
    """peak_allocated vs tokens/s of the measured rows, each point named by its setup."""
    measured = [r for r in rows if r["kind"] == "measurement" and r["status"] == "ok"
                and (r.get("throughput") or {}).get("tokens_per_s")]
    fig = _figure()
    ax = fig.add_subplot()
    xs = [r["throughput"]["tokens_per_s"] for r in measured]
    ys = [r["memory"]["peak_allocated"] / GiB for r in measured]
    ax.scatter(xs, ys)
    for r, x, y in zip(measured, xs, ys):
        ax.annotate(label(r), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xlabel("tokens/s (measured)")
    ax.set_ylabel("peak_allocated (GiB)")
    ax.set_title("Memory vs throughput")
    fig.savefig(path)
    return path


def write_all(rows: list[dict[str, Any]], out: Path, gpu: str | None = None) -> dict[str, Path]:
    """Every plot as out/NAME.png; empty when matplotlib is missing (the report says so)."""
    if not available():
        return {}
    pngs = {"breakdown": breakdown(rows, out / "breakdown.png", gpu), "batch": batch(rows, out / "batch.png")}
    if any(r["kind"] == "measurement" and r["status"] == "ok" for r in rows):
        pngs["throughput"] = throughput(rows, out / "throughput.png")
    return pngs
