"""What is live at the peak of a recorded allocator trace (benchmarks/allocator_trace.py's output).

    python benchmarks/trace_peak.py OUT_DIR/traces.json.gz [MIN_MIB]

For each trace: the peak of allocated bytes and the blocks of at least MIN_MIB (default 64) live then,
newest first, with the Python frames that allocated them, to tell which operator a simulated run lacks.
"""

from __future__ import annotations

import gzip
import json
import sys


def main(path: str, min_mib: float = 64) -> int:
    data = json.load(gzip.open(path, "rt"))
    for t in data["traces"]:
        live: dict[int, tuple[int, int, str]] = {}
        cur = peak = 0
        at_peak: dict[int, tuple[int, int, str]] = {}
        for n, (action, addr, size, _stream, where) in enumerate(t["events"]):
            if action == "alloc":
                live[addr] = (size, n, where)
                cur += size
                if cur > peak:
                    peak, at_peak = cur, dict(live)
            elif action == "free_completed" and addr in live:
                cur -= live.pop(addr)[0]
        print(f"{t['index']} {t['setup']} peak {peak / 2**30:.3f} GiB over the trace")
        big = sorted((v for v in at_peak.values() if v[0] >= min_mib * 2**20), key=lambda v: -v[1])
        for size, n, where in big[:40]:
            print(f"  {size / 2**20:9.1f} MiB  event {n:7d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 64))
