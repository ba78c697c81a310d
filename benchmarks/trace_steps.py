"""Peak allocated and reserved per training step of a recorded allocator trace, replayed.

    python benchmarks/trace_steps.py TRACES.json.gz INDEX MIB PER_STEP   # anywhere: no GPU needed

Cuts the trace of row INDEX (`w3`) of a file of `allocator_trace.py` into windows at every PER_STEP-th request
of MIB MiB (a tensor allocated a fixed number of times per step, such as the logits), replays each through
`trainmem.estimator.memory.allocator` and prints its peaks: `lab/traces.py` says why and how.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/
from lab.traces import print_windows  # noqa: E402

if __name__ == "__main__":
    sys.exit(print_windows(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
