"""Today's estimate of every ZeRO-1/2 rank measured so far (in sample, all of them): each committed row of
docs/lab/data/zero-ranks-*-h100-*.jsonl that ran, without offload, estimated again at this commit on this machine.

    python benchmarks/zero_ranks_now.py [OUT.md]

Prints one row a rank (the error of `peak_allocated` and `peak_reserved` against the measured) and, per figure,
the median |error|, the worst and how many are within 1% and 3%. No GPU needed.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from zero_ranks_gpu import SETS  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "..", "docs", "lab", "data")
FILES = {"1": "zero-ranks-h100-*.jsonl", **{k: f"zero-ranks-set{k}-h100-*.jsonl" for k in SETS if k != "1"}}


def rows() -> list[tuple[str, int, str, dict, dict]]:
    """(set, index, model, setup fields, measured memory) of each measured ZeRO-1/2 rank without offload."""
    out = []
    for name, pattern in FILES.items():
        for path in sorted(glob.glob(os.path.join(DATA, pattern))):
            for line in open(path):
                row = json.loads(line)
                measured = row["measured"]
                model, kw = SETS[name][row["index"]]
                if (measured.get("status") == "ok" and kw.get("shard") in ("zero1", "zero2")
                        and kw.get("offload", "none") == "none"):
                    out.append((name, row["index"], model, kw, measured["memory"]))
    return out


def main(argv: list[str]) -> int:
    from trainmem import ModelSpec, TrainSetup, estimate

    lines = ["| set | # | model | setup | `peak_allocated` error % | `peak_reserved` error % |", "|---|---|---|---|---:|---:|"]
    errors: dict[str, list[float]] = {"peak_allocated": [], "peak_reserved": []}
    for name, i, model, kw, measured in rows():
        guess = estimate(ModelSpec.resolve(model), TrainSetup(device="cuda", engine="deepspeed", steps=3, **kw))
        cells = []
        for f, got in errors.items():
            got.append(100 * (guess.memory[f] - measured[f]) / measured[f])
            cells.append(f"{got[-1]:+.2f}")
        words = " ".join(f"{k}={v}" for k, v in kw.items())
        lines.append(f"| {name} | {i} | {model} | {words} | {' | '.join(cells)} |")
        print(lines[-1], flush=True)
    lines += ["", "| figure | ranks | median abs error % | worst % | within 1% | within 3% |", "|---|---:|---:|---:|---:|---:|"]
    for f, got in errors.items():
        worst = max(got, key=abs)
        lines.append(f"| {f} | {len(got)} | {statistics.median(map(abs, got)):.2f} | {worst:+.2f} | "
                     f"{sum(abs(e) <= 1 for e in got)} | {sum(abs(e) <= 3 for e in got)} |")
    print("\n".join(lines[-4:]))
    if argv:
        with open(argv[0], "w") as md:
            md.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
