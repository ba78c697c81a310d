"""Speed of the two estimate methods on this machine, and the memory the simulation itself uses.

    python benchmarks/estimate_speed.py

simulate's time is the median of 3 runs of the same setup.
"""

from __future__ import annotations

import resource
import time

import trainmem
from trainmem.estimator import estimate


def main() -> None:
    for name, kw in [("llama-3.1-8b", dict(batch_size=4, precision="bf16")),
                     ("qwen2.5-7b", dict(batch_size=4, precision="bf16", checkpointing=True)),
                     ("mistral-7b", dict(batch_size=2, precision="bf16", peft="lora")),
                     ("llama-3.1-8b", dict(batch_size=8, precision="bf16", peft="qlora", checkpointing=True)),
                     ("llama-3.1-8b", dict(batch_size=4, precision="amp-bf16", checkpointing=True)),
                     ("mistral-7b", dict(batch_size=2, precision="amp-bf16", peft="lora", lora_targets=["all-linear"]))]:
        spec, setup = trainmem.ModelSpec.resolve(name), trainmem.TrainSetup(**kw)
        t0 = time.perf_counter()
        a = estimate(spec, setup, "analytic")
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for b in (1, 2, 4, 8, 16, 32):
            estimate(spec, setup.replace(batch_size=b), "analytic")
        t_each = (time.perf_counter() - t0) / 6
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            s = estimate(spec, setup, "simulate")
            times.append(time.perf_counter() - t0)
        t_sim = sorted(times)[1]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"{name} {kw}: analytic {1000 * t_each:.1f} ms/setup (first {t_first:.2f} s incl. meta model), "
              f"simulate {t_sim:.1f} s (median of 3); peaks analytic {a.peak / 2**30:.2f} / simulate {s.peak / 2**30:.2f} GiB; "
              f"process peak RSS so far {rss:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
