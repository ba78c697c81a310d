"""How fast this machine's host launches CUDA kernels, in microseconds per launch, from three tiny loops.

    python benchmarks/launch_speed.py OUT_DIR     # on the GPU: OUT_DIR/launch-speed.json

The step-time model charges `timing.HOST_PER_KERNEL` per counted launch, a constant fitted on H200 sessions whose
hosts launched at 21-55 us per launch (docs/lab/time-model.md, "Host speed"). If a micro-benchmark that takes
seconds tracks a host-bound training step's speed from session to session, the model could take the host's
speed as an input instead. This records the micro-benchmark next to each session's yardstick row (qwen2.5-0.5b
bf16 b1 x 256) so that the relation can be judged once several sessions have both; one session says nothing.

- `op`: `torch.add(x, y, out=z)` on 1024 floats: the dispatcher and launch alone;
- `linear`: a 64 x 64 `nn.Linear` forward and backward on 16 x 64: module calls and autograd (9 launches on the H200);
- `layer`: a 4-module MLP block (norm, two Linears, SiLU, residual add) forward and backward (25 launches).
Each loop runs `N` times after a warm-up, synchronised once at the end; launches are counted with the
profiler's CUDA kernel events, so each figure is seconds / kernels launched.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

N = 2000


def _per_launch(fn: Callable[[], None], n: int = N) -> tuple[float, int]:
    """Microseconds per CUDA kernel launched by `fn`, and the kernels one call launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) or 1
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / (n * kernels), kernels


def main(out_dir: str) -> int:
    import torch

    dev = "cuda"
    x, y, z = (torch.randn(1024, device=dev) for _ in range(3))
    lin = torch.nn.Linear(64, 64, device=dev)
    inp = torch.randn(16, 64, device=dev)
    block = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.SiLU(),
                                torch.nn.Linear(256, 64)).to(dev)

    def op() -> None:
        torch.add(x, y, out=z)

    def linear() -> None:
        lin(inp).sum().backward()

    def layer() -> None:
        (inp + block(inp)).sum().backward()

    found = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, fn in (("op", op), ("linear", linear), ("layer", layer)):
        us, kernels = _per_launch(fn)
        found[name] = {"us_per_launch": round(us, 2), "kernels_per_call": kernels}
        print(f"{name}: {us:.2f} us per launch ({kernels} kernels per call)", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "launch-speed.json"), "w") as f:
        json.dump(found, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
