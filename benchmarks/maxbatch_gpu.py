"""`trainmem max-batch` for polyglot-ko-1.3b on three cards x full/LoRA/QLoRA, confirmed with real runs.

    python benchmarks/maxbatch_gpu.py OUT_DIR [CARD:METHOD ...]   # on a large GPU: OUT_DIR/max-batch.jsonl

With CARD:METHOD arguments (e.g. T4:qlora) only those combinations run.

Each combination is one `trainmem max-batch --json` process (its trials are isolated runs under a cap of
RELAX times the card, see `trainmem.search.maxbatch`). Several combinations run at once on one big GPU while the
sum of their caps stays under BUDGET_GIB, so a trial can only run out of memory at its own cap, never
because a neighbour took the card.
Answers are appended as they finish, each with its wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from trainmem.search.maxbatch import RELAX

CARDS = {"T4": 15, "A100-40GB": 40, "H100-80GB": 80}
METHODS = {"full": [], "lora": ["--peft", "lora"], "qlora": ["--peft", "qlora", "--checkpointing"]}
BUDGET_GIB = 128


def main(out_dir: str, only: list[str]) -> int:
    import torch

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "max-batch.jsonl")
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    budget = min(BUDGET_GIB, total - 8)
    todo = sorted(((card, m) for card in CARDS for m in METHODS if not only or f"{card}:{m}" in only),
                  key=lambda cm: -CARDS[cm[0]])
    running: dict[tuple[str, str], tuple[subprocess.Popen, float]] = {}
    while todo or running:
        used = sum(RELAX * CARDS[c] + 1 for c, _ in running)
        for cm in list(todo):
            if used + RELAX * CARDS[cm[0]] + 1 <= budget:
                cmd = [sys.executable, "-m", "trainmem", "max-batch", "--model", "polyglot-ko-1.3b", "--precision", "fp16",
                       "--gpu", cm[0], "--json", *METHODS[cm[1]]]
                running[cm] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True), time.time())
                todo.remove(cm)
                used += RELAX * CARDS[cm[0]] + 1
        time.sleep(1)
        for cm, (proc, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[cm]
            out = proc.stdout.read().strip().splitlines() if proc.stdout else []
            row = json.loads(out[-1]) if out else {"error": f"exit {proc.returncode}, no answer"}
            row.update(card=cm[0], method=cm[1], wall_s=round(time.time() - t0, 1))
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
