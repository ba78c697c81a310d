"""A guard for changes that should make the estimate faster and change none of its figures.

    python benchmarks/estimate_guard.py dump OUT.json [--quick]     # every setup's whole answer, with timings
    python benchmarks/estimate_guard.py compare BASE.json [--quick] # the same now, each difference printed

For ~15 representative setups (tiny and real presets: dense LoRA, full amp-bf16, checkpointing, QLoRA, an 8-bit
optimizer, mixtures of experts, hybrids, gradient accumulation, a capped card whose need is bisected, an FSDP2 rank
at --gpus 4, several cards from one simulated step) it keeps the estimate's whole answer: every memory and
breakdown term, model states, terms, notes, the step time, per card. `compare` exits 1 on any difference and prints
each setup's seconds beside the dump's. `--quick` leaves out the slowest real presets (the 8B and the 1B FSDP rank).
The environment stamp (commit, versions) is left out: it changes with every commit and says nothing of a figure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ["TRAINMEM_CACHE"] = "off"

SETUPS: list[tuple[str, str, dict[str, Any]]] = [
    ("tiny full", "tiny-llama", {}),
    ("tiny lora grad-accum 2", "tiny-gpt-neox", {"peft": "lora", "grad_accum": 2, "gpu": "A10G"}),
    ("tiny gpt2 eager fp32", "tiny-gpt2", {"attention": "eager", "precision": "fp32", "gpu": "T4"}),
    ("tiny qwen2 adamw-8bit", "tiny-qwen2", {"optimizer": "adamw-8bit", "gpu": "H100"}),
    ("tiny qwen3-moe lora", "tiny-qwen3-moe", {"peft": "lora", "gpu": "H100"}),
    ("tiny olmoe full amp-bf16", "tiny-olmoe", {"precision": "amp-bf16", "gpu": "A100-80GB"}),
    ("tiny lfm2 hybrid", "tiny-lfm2", {"checkpointing": True}),
    ("tiny granitemoehybrid", "tiny-granitemoehybrid", {"peft": "lora"}),
    ("tiny fsdp gpus 4", "tiny-llama", {"gpus": 4, "shard": "fsdp", "precision": "bf16", "gpu": "H100"}),
    ("qwen2.5-0.5b full amp-bf16", "qwen2.5-0.5b", {"precision": "amp-bf16", "batch_size": 2, "seq_len": 512,
                                                   "gpu": "H100"}),
    ("llama-3.2-1b qlora", "llama-3.2-1b", {"peft": "qlora", "batch_size": 2, "seq_len": 512, "gpu": "A10G"}),
    ("llama-3.2-1b checkpointing grad-accum 2", "llama-3.2-1b",
     {"checkpointing": True, "precision": "bf16", "grad_accum": 2, "batch_size": 2, "seq_len": 1024}),
    ("gemma-2-2b lora (sliding/global)", "gemma-2-2b", {"peft": "lora", "batch_size": 1, "seq_len": 512}),
    ("gpt2 fp32 capped on a T4 (need bisected)", "gpt2", {"precision": "fp32", "batch_size": 16, "seq_len": 1024,
                                                          "gpu": "T4"}),
    ("olmoe-1b-7b lora", "olmoe-1b-7b", {"peft": "lora", "batch_size": 1, "seq_len": 512, "gpu": "H100"}),
    ("lfm2-1.2b full", "lfm2-1.2b", {"batch_size": 1, "seq_len": 512, "gpu": "H100"}),
    ("llama-3.1-8b lora 2048 tokens", "llama-3.1-8b", {"peft": "lora", "batch_size": 4, "seq_len": 2048,
                                                       "gpu": "A100-80GB"}),
    ("llama-3.2-1b fsdp gpus 4", "llama-3.2-1b", {"gpus": 4, "shard": "fsdp", "precision": "bf16",
                                                  "checkpointing": True, "seq_len": 1024, "gpu": "H100"}),
]
SLOW = {"llama-3.1-8b lora 2048 tokens", "llama-3.2-1b fsdp gpus 4"}
CARDS = ("tiny lora on four cards", "tiny-llama", {"peft": "lora", "batch_size": 64, "seq_len": 512},
         ["T4", "A10G", "L4", "H100"])


def _answer(b: Any) -> dict[str, Any]:
    d = b.to_result().to_dict() if hasattr(b, "to_result") else {"error": str(b)}
    d.pop("env", None)
    return d


def run(quick: bool) -> dict[str, Any]:
    import trainmem
    from trainmem.search.cards import estimate_cards

    out: dict[str, Any] = {}
    for name, model, fields in SETUPS:
        if quick and name in SLOW:
            continue
        t0 = time.perf_counter()
        answer = _answer(trainmem.estimate(model, trainmem.TrainSetup(**fields)))
        out[name] = {"answer": answer, "seconds": round(time.perf_counter() - t0, 2)}
        print(f"{out[name]['seconds']:8.2f} s  {name}", flush=True)
    name, model, fields, cards = CARDS
    t0 = time.perf_counter()
    answers = {c: _answer(b) for c, b in estimate_cards(model, trainmem.TrainSetup(**fields), cards).items()}
    out[name] = {"answer": answers, "seconds": round(time.perf_counter() - t0, 2)}
    print(f"{out[name]['seconds']:8.2f} s  {name}", flush=True)
    return out


def _diff(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("dump", "compare"):
        print(__doc__)
        return 2
    quick = "--quick" in argv
    now = run(quick)
    if argv[0] == "dump":
        with open(argv[1], "w") as f:
            json.dump(now, f, indent=1, sort_keys=True)
        return 0
    with open(argv[1]) as f:
        base = json.load(f)
    bad = 0
    print(f"{'setup':<45} {'base s':>8} {'now s':>8}  same")
    for name, row in now.items():
        if name not in base:
            print(f"{name:<45} not in {argv[1]}")
            bad += 1
            continue
        diffs = _diff(base[name]["answer"], row["answer"], "")
        bad += bool(diffs)
        print(f"{name:<45} {base[name]['seconds']:>8.2f} {row['seconds']:>8.2f}  {'yes' if not diffs else 'NO'}")
        for d in diffs[:20]:
            print(f"    {d}")
    print("every figure identical" if not bad else f"{bad} setups differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
