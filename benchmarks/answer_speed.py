"""How long a user waits for each answer, beside the target it should meet, on this machine.

    python benchmarks/answer_speed.py [--quick]     # --quick: leaves out the 30B MoE and the 70B rank

Every figure is the wall time of a fresh `trainmem` process, as a user runs it, with an empty answer cache
(`TRAINMEM_CACHE_DIR` in a temporary folder) unless the row says the setup was seen before. The first line is
`python -c "import torch, transformers"` in the same run, and the second that with peft and a model class: the floor
of any answer that builds a model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

LLAMA_70B = {  # meta-llama/Llama-3.1-70B's config.json (the fields the model reads)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}


def timed(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(args, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, p.returncode


def main(quick: bool) -> int:
    tmp = tempfile.mkdtemp()
    env = {**os.environ, "TRAINMEM_CACHE": "on", "TRAINMEM_CACHE_DIR": os.path.join(tmp, "cache")}
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(LLAMA_70B, f)
    tm = [sys.executable, "-m", "trainmem"]
    floor, _ = timed([sys.executable, "-c", "import torch, transformers"], env)
    classes, _ = timed([sys.executable, "-c", "import torch, transformers, peft; from transformers import "
                        "LlamaForCausalLM"], env)
    rows = [("import torch, transformers", None, floor),
            ("... and peft and a model class (a new 8B's floor)", None, classes)]
    rows.append(("a bad input (--optimizer adamw8bit)", 1.0, timed(
        tm + ["estimate", "--model", "llama-3.1-8b", "--optimizer", "adamw8bit", "--gpu", "A10G"], env)[0]))
    dense = ["estimate", "--model", "llama-3.1-8b", "--peft", "lora", "--batch-size", "4", "--seq-len", "2048",
             "--gpu", "A100-80GB"]
    one, _ = timed(tm + dense, env)
    rows.append(("estimate, a new dense 8B (llama-3.1-8b LoRA)", 5.0, one))
    rows.append(("estimate, the same setup seen before", 1.0, timed(tm + dense, env)[0]))
    big = [("estimate, a hybrid (lfm2-1.2b full, 2048 tokens)",
            ["estimate", "--model", "lfm2-1.2b", "--batch-size", "4", "--seq-len", "2048", "--gpu", "H100"])]
    if not quick:
        big += [("estimate, Qwen3-30B-A3B LoRA", ["estimate", "--model", "qwen3-30b-a3b", "--peft", "lora",
                                                 "--batch-size", "2", "--seq-len", "1024", "--gpu", "H100"]),
                ("estimate, a 70B rank at --gpus 8 --shard fsdp", ["estimate", "--model", os.path.join(tmp, "config.json"),
                                                                  "--gpus", "8", "--shard", "fsdp", "--precision", "bf16",
                                                                  "--checkpointing", "--gpu", "H100"])]
    for what, args in big:
        rows.append((what, 15.0, timed(tm + args, env)[0]))
    search = ["--model", "llama-3.1-8b", "--peft", "lora", "--seq-len", "2048", "--gpu", "A100-80GB"]
    rows.append(("max-batch (target: 3x one estimate)", 3 * one, timed(tm + ["max-batch", *search], env)[0]))
    rows.append(("plan (target: 3x one estimate)", 3 * one,
                 timed(tm + ["plan", *search, "--target-batch", "32"], env)[0]))
    rows.append(("the page's every-card table, a new 8B, every group simulated", 20.0, page_table(env)))
    print(f"{'answer':<52} {'target s':>9} {'measured s':>11}  met")
    for what, target, seconds in rows:
        met = "" if target is None else ("yes" if seconds <= target else "NO")
        print(f"{what:<52} {'' if target is None else f'{target:.1f}':>9} {seconds:>11.2f}  {met}", flush=True)
    return 0


PAGE = """
import os, sys, time
from trainmem.serve.answers import Answers, Waiting
from trainmem.serve.workers import Workers
workers = Workers()  # as `trainmem serve` makes them at its start
answers = Answers(workers)
time.sleep(15)  # a server up for a while before its first question
form = {"model": "llama-3.1-8b", "peft": "lora", "batch_size": "4", "seq_len": "2048", "precision": "bf16",
        "card": "A100-80GB"}
t0 = time.perf_counter()
while True:
    got = answers.ask(form)
    if not isinstance(got, Waiting) and got.pending == 0:
        break
    time.sleep(0.5)
print(time.perf_counter() - t0, got.timed_out, got.groups)
workers.close()
answers.close()
"""


def page_table(env: dict[str, str]) -> float:
    """Seconds from a new model's first ask of the page's answers (`serve.answers.Answers` with the worker pool
    `trainmem serve` makes, 15 s after it was made) until no runtime group is pending, polled as the page polls."""
    p = subprocess.run([sys.executable, "-c", PAGE], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr[-2000:], file=sys.stderr)
        return float("nan")
    return float(p.stdout.split()[0])


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
