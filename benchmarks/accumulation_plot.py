"""Naive vs token-weighted accumulation error as the spread of sequence lengths grows.

    pip install matplotlib==3.11.2   # for this plot only; not a trainmem dependency
    python benchmarks/accumulation_plot.py [--out docs/lab/accumulation-error.png --draws 20]

tiny-llama in float64 on the CPU, a full batch of 8 padded samples accumulated as 2 micro-batches of 4.
Sample lengths are drawn uniformly from [round(64 * (1 - spread)), 64]; at spread 0 every micro-batch
holds the same number of label tokens, so both rules must agree, and only the spread separates them.
Whole micro-batches keep the partial-window effect out of the picture. Each spread is drawn `--draws`
times; the plot and the printed Markdown table show the mean (naive) and the worst (trainmem).
"""

from __future__ import annotations

import argparse

import torch

import trainmem
from trainmem.measure.data import Sample, dummy_dataset
from trainmem.measure.verify import TOLERANCES, compare_gradients, prepare_model

MAX_LEN, FULL, MICRO = 64, 8, 4
SPREADS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def padded_samples(spread: float, vocab: int, seed: int) -> list[Sample]:
    """FULL dummy samples cut to lengths drawn from [MAX_LEN * (1 - spread), MAX_LEN]."""
    g = torch.Generator().manual_seed(seed)
    shortest = max(2, round(MAX_LEN * (1 - spread)))
    lengths = torch.randint(shortest, MAX_LEN + 1, (FULL,), generator=g).tolist()
    full = dummy_dataset(FULL, MAX_LEN, vocab, seed=seed)
    return [{k: v[:n] for k, v in s.items()} for s, n in zip(full, lengths)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/lab/accumulation-error.png")
    ap.add_argument("--draws", type=int, default=20)
    args = ap.parse_args()

    spec = trainmem.ModelSpec.resolve("tiny-llama")
    model = prepare_model(spec, trainmem.TrainSetup(), "float64")
    ours, naive = [], []
    for spread in SPREADS:
        reports = [compare_gradients(model, padded_samples(spread, spec.vocab_size, seed), MICRO)
                   for seed in range(args.draws)]
        ours.append(max(r.max_rel_error for r in reports))
        naive.append(sum(r.naive_max_rel_error for r in reports) / len(reports))

    print("| length spread | trainmem (worst) | naive (mean) |\n|---|---|---|")
    for s, o, n in zip(SPREADS, ours, naive):
        print(f"| {s:.1f} | {o:.1e} | {n:.1e} |")

    import matplotlib

    matplotlib.use("Agg")  # no display on a build machine
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    # Exact zeros (equal lengths) cannot sit on a log axis; draw them at the float64 epsilon.
    floor = torch.finfo(torch.float64).eps
    ax.semilogy(SPREADS, [max(v, floor) for v in naive], "o-", color="tab:red", label="naive (seed): mean / steps")
    ax.semilogy(SPREADS, [max(v, floor) for v in ours], "s-", color="tab:green", label="trainmem: sum / window tokens")
    ax.axhline(TOLERANCES["float64"], ls="--", color="grey", lw=1, label="pass bound 1e-10")
    ax.set_xlabel(f"spread of sequence lengths (shortest = {MAX_LEN} x (1 - spread))")
    ax.set_ylabel("max ||g_acc - g_full|| / ||g_full||")
    ax.set_title(f"tiny-llama, float64, batch {FULL} = {FULL // MICRO} x {MICRO}", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
