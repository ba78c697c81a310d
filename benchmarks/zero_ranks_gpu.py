"""One rank of a DeepSpeed ZeRO run, measured on one GPU through the fake process group (issue 40, item 3), beside
trainmem's estimate of the same setup: measured vs estimated peak_allocated and peak_reserved.

    python benchmarks/zero_ranks_gpu.py OUT_DIR [--set 1|2|3|4|5|6|7] [INDEX ...]   # on a GPU with DeepSpeed importable

Each rank runs as `trainmem run --device cuda --engine deepspeed --gpus N --shard zeroK --rank R` in a fresh
process (`trainmem.isolation.runner.run`), 3 steps, up to 10 minutes; its row goes to OUT_DIR/zero-ranks.jsonl and
a table of errors to OUT_DIR/zero-ranks.md (and the terminal). Chosen before any ran; the estimator is not tuned
to them. DeepSpeed without its C++ ops: `DS_BUILD_OPS=0 pip install deepspeed` (the engine steps trainmem's own
torch optimizer, so no fused or CPU Adam is compiled).
"""

from __future__ import annotations

import json
import os
import sys
import time

CKPT = dict(checkpointing=True)
RANKS: list[tuple[str, dict]] = [
    ("qwen2.5-0.5b", dict(shard="zero1", gpus=2, precision="bf16", batch_size=4, seq_len=1024)),
    ("qwen2.5-0.5b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=4, seq_len=1024, rank=3)),
    ("qwen2.5-0.5b", dict(shard="zero3", gpus=8, precision="bf16", batch_size=4, seq_len=1024, rank=5)),
    ("qwen2.5-0.5b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=4, seq_len=1024, offload="optimizer")),
    ("llama-3.2-1b", dict(shard="zero1", gpus=8, precision="bf16", batch_size=2, seq_len=2048, **CKPT)),
    ("llama-3.2-1b", dict(shard="zero2", gpus=2, precision="amp-bf16", batch_size=2, seq_len=1024, **CKPT)),
    ("llama-3.2-1b", dict(shard="zero3", gpus=4, precision="bf16", batch_size=2, seq_len=2048, rank=1, **CKPT)),
    ("llama-3.2-1b", dict(shard="zero3", gpus=8, precision="bf16", batch_size=2, seq_len=2048, offload="optimizer",
                          **CKPT)),
    ("qwen2.5-1.5b", dict(shard="zero3", gpus=8, precision="bf16", batch_size=2, seq_len=1024, offload="params")),
    ("qwen2.5-1.5b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=2, seq_len=1024, rank=7)),
]
"""Ten ranks over three dense presets: ZeRO-1/2/3, optimizer and parameter offload, worlds 2 to 8 (set 1, measured
at 8532e22; the estimator's ZeRO-3 live parameters and reserved ratio were fitted to it afterwards)."""

RANKS_2: list[tuple[str, dict]] = [
    ("qwen3-0.6b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=4, seq_len=1024)),
    ("qwen3-0.6b", dict(shard="zero3", gpus=8, precision="bf16", batch_size=2, seq_len=2048, rank=2, **CKPT)),
    ("olmo-2-1b", dict(shard="zero1", gpus=4, precision="bf16", batch_size=2, seq_len=1024)),
    ("olmo-2-1b", dict(shard="zero3", gpus=4, precision="amp-bf16", batch_size=2, seq_len=1024, **CKPT)),
    ("llama-3.2-3b", dict(shard="zero3", gpus=8, precision="bf16", batch_size=1, seq_len=2048, **CKPT)),
    ("llama-3.2-3b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=1024, offload="optimizer",
                          **CKPT)),
    ("polyglot-ko-1.3b", dict(shard="zero2", gpus=2, precision="fp32", batch_size=2, seq_len=512)),
    ("stablelm-2-1.6b", dict(shard="zero3", gpus=8, precision="bf16", batch_size=2, seq_len=1024, offload="params")),
    ("phi-2", dict(shard="zero1", gpus=8, precision="bf16", batch_size=1, seq_len=1024, peft="lora", **CKPT)),
    ("gemma-3-1b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=2, seq_len=1024)),
]
"""Set 2, held out for the fitted estimator: ten ranks over seven other presets, chosen at the commit that added
them (647a43d), before any ran; measured at 1e4491e (docs/lab/zero-held-out-2026-12-06.md)."""

RANKS_3: list[tuple[str, dict]] = [
    ("gemma-2-2b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=2, seq_len=1024)),
    ("opt-1.3b", dict(shard="zero1", gpus=2, precision="bf16", batch_size=4, seq_len=1024)),
    ("bloom-560m", dict(shard="zero2", gpus=8, precision="bf16", batch_size=4, seq_len=1024, grad_accum=2)),
    ("phi-3-mini", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=2048, **CKPT)),
    ("qwen2.5-7b", dict(shard="zero1", gpus=4, precision="bf16", batch_size=2, seq_len=1024, peft="lora", **CKPT)),
    ("polyglot-ko-3.8b", dict(shard="zero2", gpus=4, precision="amp-bf16", batch_size=1, seq_len=1024, **CKPT)),
    ("lfm2-1.2b", dict(shard="zero2", gpus=2, precision="bf16", batch_size=2, seq_len=1024)),
    ("mistral-7b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=1024, offload="optimizer",
                        **CKPT)),
    ("llama-3.2-1b", dict(shard="zero1", gpus=2, precision="fp32", batch_size=2, seq_len=1024)),
    ("olmoe-1b-7b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=2, seq_len=1024, **CKPT)),
]
"""Set 3, held out for ZeRO-1/2 ranks priced from the single-GPU simulated step (`estimator/memory/zero.py`): ten
ranks over ten presets not in sets 1 and 2's ZeRO-1/2 rows (Gemma-2, OPT, BLOOM, Phi-3, Qwen2.5-7B LoRA, GPT-NeoX
3.8B under autocast, an LFM2 hybrid, Mistral with optimizer offload, Llama in fp32, an OLMoE mixture of experts),
accumulation over two micro-batches in one; chosen at the commit that added them, before any ran."""

RANKS_4: list[tuple[str, dict]] = [
    ("gpt2", dict(shard="zero2", gpus=4, precision="bf16", batch_size=4, seq_len=1024, rank=1)),
    ("stablelm-2-1.6b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=1024, rank=5, **CKPT)),
    ("falcon-7b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=1024, optimizer="adamw-fused",
                       rank=5, **CKPT)),
    ("llama-3.1-8b", dict(shard="zero1", gpus=8, precision="bf16", batch_size=1, seq_len=1024, rank=5, **CKPT)),
    ("polyglot-ko-5.8b", dict(shard="zero2", gpus=4, precision="amp-bf16", batch_size=1, seq_len=512, **CKPT)),
    ("llama-3.1-8b", dict(shard="zero2", gpus=2, precision="bf16", batch_size=2, seq_len=1024, peft="lora", **CKPT)),
    ("stablelm-2-1.6b", dict(shard="zero1", gpus=4, precision="fp32", batch_size=2, seq_len=512, rank=3)),
    ("polyglot-ko-12.8b", dict(shard="zero2", gpus=16, precision="bf16", batch_size=1, seq_len=512, grad_accum=2,
                               rank=6, **CKPT)),
    ("qwen1.5-moe-a2.7b", dict(shard="zero2", gpus=16, precision="bf16", batch_size=2, seq_len=1024, rank=2, **CKPT)),
    ("deepseek-v2-lite", dict(shard="zero2", gpus=16, precision="bf16", batch_size=1, seq_len=1024, rank=3, **CKPT)),
]
"""Set 4, held out for DeepSpeed's optimizer step priced on the fullest rank (`zero.optimizer_step`): ten ranks
over presets no earlier set's ZeRO-1/2 rows used (GPT-2, StableLM-2, Falcon with fused AdamW, Llama-3.1-8B full
under ZeRO-1 and LoRA under ZeRO-2, GPT-NeoX 5.8B under autocast, StableLM-2 in fp32, GPT-NeoX 12.8B with
accumulation, two mixtures of experts), worlds 2 to 16; each rank is the one the estimate names the fullest
(`zero.StepPeak.rank`, computed when they were chosen). Chosen at the commit that added them, before any ran."""

RANKS_5: list[tuple[str, dict]] = [
    ("llama-3.2-3b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=2, seq_len=1024, rank=0)),
    ("llama-3.2-3b", dict(shard="zero1", gpus=2, precision="bf16", batch_size=1, seq_len=2048, rank=1, **CKPT)),
    ("qwen2.5-1.5b", dict(shard="zero1", gpus=4, precision="bf16", batch_size=4, seq_len=1024, grad_accum=2, rank=2)),
    ("qwen3-0.6b", dict(shard="zero2", gpus=8, precision="amp-bf16", batch_size=4, seq_len=1024, rank=3, **CKPT)),
    ("gemma-3-1b", dict(shard="zero1", gpus=8, precision="fp32", batch_size=2, seq_len=512, rank=0)),
    ("mistral-7b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=4, seq_len=1024, peft="lora", rank=1,
                        **CKPT)),
    ("olmo-2-1b", dict(shard="zero2", gpus=2, precision="bf16", batch_size=2, seq_len=2048, rank=1)),
    ("phi-2", dict(shard="zero2", gpus=8, precision="bf16", batch_size=2, seq_len=1024, optimizer="adamw-fused",
                   rank=6, **CKPT)),
    ("polyglot-ko-1.3b", dict(shard="zero1", gpus=8, precision="bf16", batch_size=8, seq_len=512, rank=7)),
    ("qwen3-30b-a3b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=512, peft="lora", rank=0,
                           **CKPT)),
]
"""Set 5, held out for a ZeRO-1/2 rank's reserved bytes from the allocator replay of its events (`zero.rank_events`):
ten ranks over setups no earlier set ran (LLaMA-3.2-3B full under ZeRO-1 and ZeRO-2, ZeRO-1 with accumulation, Qwen3
under autocast, Gemma-3 in fp32, Mistral LoRA, OLMo-2 at 2048 tokens, Phi-2 with fused AdamW, GPT-NeoX at batch 8,
a Qwen3-30B-A3B mixture of experts with LoRA), worlds 2 to 8, ranks 0 to 7. Chosen at the commit that added them,
before any ran."""

RANKS_6: list[tuple[str, dict]] = [
    ("gemma-2-2b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=2, seq_len=1024, rank=0)),
    ("llama-3.2-1b", dict(shard="zero2", gpus=16, precision="bf16", batch_size=4, seq_len=1024, rank=0, **CKPT)),
    ("qwen2.5-7b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=2048, rank=7, **CKPT)),
    ("gemma-3-1b", dict(shard="zero1", gpus=4, precision="bf16", batch_size=4, seq_len=1024, rank=1)),
    ("phi-3-mini", dict(shard="zero1", gpus=4, precision="bf16", batch_size=1, seq_len=1024, rank=3, **CKPT)),
    ("qwen2.5-0.5b", dict(shard="zero2", gpus=2, precision="fp32", batch_size=4, seq_len=512, rank=1)),
    ("bloom-560m", dict(shard="zero1", gpus=2, precision="bf16", batch_size=2, seq_len=1024, rank=0)),
    ("olmoe-1b-7b", dict(shard="zero1", gpus=8, precision="bf16", batch_size=1, seq_len=1024, rank=2, **CKPT)),
    ("llama-3.1-8b", dict(shard="zero2", gpus=16, precision="bf16", batch_size=1, seq_len=1024, rank=15, **CKPT)),
    ("qwen3-0.6b", dict(shard="zero2", gpus=4, precision="amp-bf16", batch_size=2, seq_len=1024, grad_accum=2,
                        rank=0)),
]
"""Set 6, held out for DeepSpeed's gradient norm in the rank's step (`zero.NORM_BYTES`, the fp64 copy of each
gradient piece of the partition): ten ranks over setups no earlier set ran, several whose partition holds a large
embedding (Gemma-2 and Llama-3.2-1B at worlds 8 and 16, BLOOM, Gemma-3), ZeRO-1 with a mixture of experts,
Llama-3.1-8B at world 16, Qwen2.5 in fp32, ZeRO-2 with accumulation under autocast; worlds 2 to 16, ranks 0 to 15.
Chosen at the commit that added them, before any ran."""

RANKS_7: list[tuple[str, dict]] = [
    ("llama-3.2-3b", dict(shard="zero1", gpus=4, precision="bf16", batch_size=2, seq_len=1024, rank=3, **CKPT)),
    ("qwen2.5-1.5b", dict(shard="zero1", gpus=8, precision="bf16", batch_size=2, seq_len=1024, rank=5)),
    ("mistral-7b", dict(shard="zero1", gpus=16, precision="bf16", batch_size=1, seq_len=512, rank=9, **CKPT)),
    ("stablelm-2-1.6b", dict(shard="zero1", gpus=2, precision="bf16", batch_size=2, seq_len=1024, rank=1)),
    ("gemma-2-2b", dict(shard="zero1", gpus=4, precision="bf16", batch_size=1, seq_len=1024, rank=2, **CKPT)),
    ("opt-1.3b", dict(shard="zero1", gpus=8, precision="bf16", batch_size=4, seq_len=512, rank=0)),
    ("qwen3-0.6b", dict(shard="zero1", gpus=4, precision="fp32", batch_size=2, seq_len=1024, rank=3)),
    ("polyglot-ko-3.8b", dict(shard="zero1", gpus=8, precision="amp-bf16", batch_size=1, seq_len=1024, rank=6,
                              **CKPT)),
    ("falcon-7b", dict(shard="zero2", gpus=8, precision="bf16", batch_size=1, seq_len=1024, rank=4, **CKPT)),
    ("llama-3.2-1b", dict(shard="zero2", gpus=4, precision="bf16", batch_size=4, seq_len=1024, grad_accum=2,
                          rank=2)),
]
"""Set 7, held out for a ZeRO-1 rank's gradients larger than DeepSpeed's bucket, which its reduction does not free:
eight ZeRO-1 ranks over setups no earlier set ran (Llama-3.2-3B on the last rank, Qwen2.5 at world 8, Mistral-7B at
world 16, StableLM-2, Gemma-2, OPT at batch 4, Qwen3 in fp32, GPT-NeoX under autocast) and two ZeRO-2 ranks that the
change should leave alone (Falcon-7B, Llama-3.2-1B with accumulation); worlds 2 to 16, ranks 0 to 9. Chosen at the
commit that added them, before any ran and before the change."""

SETS = {"1": RANKS, "2": RANKS_2, "3": RANKS_3, "4": RANKS_4, "5": RANKS_5, "6": RANKS_6, "7": RANKS_7}

FIELDS = ("peak_allocated", "peak_reserved")


def main(argv: list[str]) -> int:
    from trainmem import ModelSpec, TrainSetup, estimate
    from trainmem.isolation.runner import run

    ranks = SETS["1"]
    if len(argv) > 2 and argv[1] == "--set":
        ranks, argv = SETS[argv[2]], argv[:1] + argv[3:]
    out_dir, picks = argv[0], [int(a) for a in argv[1:]] or range(len(ranks))
    os.makedirs(out_dir, exist_ok=True)
    lines = ["| # | model | setup | field | measured MiB | estimated MiB | error % |", "|---|---|---|---|---|---|---|"]
    with open(os.path.join(out_dir, "zero-ranks.jsonl"), "a") as rows:
        for i in picks:
            name, kw = ranks[i]
            spec = ModelSpec.resolve(name)
            setup = TrainSetup(device="cuda", engine="deepspeed", steps=3, **kw)
            t0 = time.time()
            measured = run(spec, setup, timeout=600)
            guess = estimate(spec, setup)
            rows.write(json.dumps({"index": i, "measured": measured.to_dict(), "estimate": guess.memory,
                                   "seconds": time.time() - t0}) + "\n")
            words = " ".join(f"{k}={v}" for k, v in kw.items())
            if measured.status != "ok":
                lines.append(f"| {i} | {name} | {words} | {measured.status} | | | |")
                print(i, name, words, measured.status, (measured.error or "")[-2000:], flush=True)
                continue
            for f in FIELDS:
                m, e = measured.memory[f], guess.memory[f]
                lines.append(f"| {i} | {name} | {words} | {f} | {m / 2**20:.0f} | {e / 2**20:.0f} | "
                             f"{100 * (e - m) / m:+.1f} |")
            print("\n".join(lines[-2:]), flush=True)
    with open(os.path.join(out_dir, "zero-ranks.md"), "w") as md:
        md.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
