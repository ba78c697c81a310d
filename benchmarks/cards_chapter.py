"""The chapter's seven setups on every catalog card, by both methods: where do their verdicts differ?

    PYTHONPATH=src python benchmarks/cards_chapter.py [--cards T4,L4] [--margin 0.02]

One `estimate(..., "simulate")` per card and setup: with a card, it carries the analytic method's reserved
bytes too, so its verdict holds both levels (`verdict["methods"]`). The simulated step depends on the card
only through the cuBLAS workspace and the SDPA kernel, so it runs once per (setup, workspace, kernel) and
is replayed through each card's allocator cap (a memo around `simulate_step`, this script only).
Prints a Markdown table, one line per card and setup, and the disagreements.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trainmem.estimator as est
from trainmem.config.chapter import MODEL, RUNS
from trainmem.hardware.gpus import CATALOG

_memo: dict[tuple[Any, ...], Any] = {}
_simulate_step = est.simulate_step


def _cached_step(build: Any, setup: Any, precision: Any = None, **card: Any) -> Any:
    key = (repr({k: v for k, v in setup.to_dict().items() if k != "gpu"}), precision, repr(sorted(card.items())))
    if key not in _memo:
        _memo[key] = _simulate_step(build, setup, precision, **card)
    return _memo[key]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cards", default=",".join(CATALOG))
    ap.add_argument("--margin", type=float, default=0.02)
    args = ap.parse_args()
    est.simulate_step = _cached_step  # type: ignore[assignment]
    print("| card | setup | simulate | analytic | simulate reserved GiB | analytic reserved GiB | headroom GiB |")
    print("|---|---|---|---|---|---|---|")
    disagree = []
    t0 = time.time()
    for name in args.cards.split(","):
        for run in RUNS:
            b = est.estimate(MODEL, run.setup.replace(gpu=name), "simulate")
            v = b.verdict(name, args.margin)
            sim, ana = v["methods"]["simulate"], v["methods"]["analytic"]
            print(f"| {name} | {run.label} | {sim} | {ana} | {b.memory['peak_reserved'] / 2**30:.3f} | "
                  f"{b.terms['analytic_reserved'] / 2**30:.3f} | {v['headroom'] / 2**30:+.3f} |", flush=True)
            if v["disagree"]:
                disagree.append(f"{name} {run.label}: simulate {sim}, analytic {ana}")
    print(f"\n{len(disagree)} disagreement(s) ({time.time() - t0:.0f} s):")
    for d in disagree:
        print(f"- {d}")


if __name__ == "__main__":
    main()
