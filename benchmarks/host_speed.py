"""How fast each session's host launched kernels, from the host-bound rows of the committed H200 (and H100)
measurements.

    python benchmarks/host_speed.py [JSONL ...]    # anywhere: no GPU needed; default: the fit files and held-out 13

A row is host-bound where the step-time model's host time (`timing.HOST_PER_KERNEL` per launch counted on
the meta trace) exceeds its card time (compute and memory) by `BOUND` or more: its measured step time is then
close to launches x the host's seconds per launch, so measured / launches is that host's speed, whatever the
fitted constant says. Printed per file, which is per device session (each file was measured in one or two
sessions of the lent H200, on whichever host came): when the same software launches at very different speeds in
different files, the host-bound rows' error has a floor that no constant fits, and the user's own CPU matters
the same way.
"""

from __future__ import annotations

import os
import statistics
import sys

from trainmem.estimator.time import step as timing
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/
from lab import repository  # noqa: E402
from lab import timing as tv  # noqa: E402

BOUND = 1.3
"""Host time over card time at which a row counts as host-bound."""


def host_bound(paths: list[str]) -> dict[str, list[tuple[str, float, float]]]:
    """Per file: (row label, measured microseconds per launch, the model's error) of its host-bound rows."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for path, r in tv.timed(tv.rows(paths)):
        work, card = tv.row_work(r)
        st = timing.step_time(work, card)
        parts = st.parts
        if parts["host"] < BOUND * (parts["compute"] + parts["memory"]):
            continue
        measured = tv.measured_s(r)
        per_launch = measured / (work.launches * work.micro_steps + timing.QLORA_OPS * work.quant_calls
                                 * work.micro_steps)
        out.setdefault(os.path.basename(path), []).append((tv.label(r), 1e6 * per_launch, st.step_s / measured - 1))
    return out


def main(paths: list[str]) -> int:
    found = host_bound(paths)
    print("| file | host-bound rows | measured us per launch (median) | range | model error range |")
    print("|---|---:|---:|---|---|")
    for file, rows in found.items():
        speeds = [s for _, s, _ in rows]
        errs = [e for _, _, e in rows]
        print(f"| {file} | {len(rows)} | {statistics.median(speeds):.1f} | {min(speeds):.1f}-{max(speeds):.1f} "
              f"| {100 * min(errs):+.0f}% to {100 * max(errs):+.0f}% |")
    print()
    for file, rows in found.items():
        for label, speed, e in rows:
            print(f"{file}: {label}: {speed:.1f} us per launch, model {100 * e:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or tv.fit_paths() + [
        str(repository.docs("lab", "data", "validation-held-out-13-h200-2026-12-05.jsonl"))]))
