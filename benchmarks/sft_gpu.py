"""`--engine sft` against measured runs: TRL's SFTTrainer, packing real text, priced with TRL's fused LM head
(`estimator/memory/trlhead.py`). Llama-3.2-1B (vocabulary 128256) and Qwen2.5-0.5B (151936), LoRA and full
fine-tunes in amp-bf16, random weights; the text is this repository's docs and the seed chapter
(benchmarks/data/seed_chapter.txt, our own text), tokenized by a byte-level BPE trained on it at run time
(`tokenizers`: no download), saved beside the preset's config.json in a model folder under OUT.

    python benchmarks/sft_gpu.py OUT [--device cpu]   # each setup in a fresh `trainmem run`, then `trainmem estimate`

On the GPU, TRL and `datasets` come as wheels (the image has pyarrow, pandas, xxhash, fsspec; not datasets, dill,
multiprocess, trl), installed with `python3 -m pip install -q --no-index --no-deps --target /tmp/site WHEELS` and
`PYTHONPATH=/tmp/site:$PWD/src:$PWD`. `--device cpu` runs the same path on tiny-llama in seconds (a test of the
script, not a measurement). Rows: OUT/sft-measured.jsonl and OUT/sft-estimates.jsonl; the table is printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQ = 2048
BASE = ["--engine", "sft", "--data-mode", "pack", "--precision", "amp-bf16", "--steps", "4", "--seq-len", str(SEQ)]
SETUPS = [(model, peft, batch) for model in ("llama-3.2-1b", "qwen2.5-0.5b") for peft, batch in (("lora", 4), ("none", 2))]
"""(preset, --peft, --batch-size): each model's LoRA and full fine-tune."""
CPU = [("tiny-llama", "lora", 2), ("tiny-llama", "none", 2)]


def text(out: Path) -> Path:
    """The real text: every docs/ page and the seed chapter, concatenated."""
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "benchmarks/data/seed_chapter.txt"]
    path = out / "text.txt"
    path.write_text("\n\n".join(p.read_text(encoding="utf-8") for p in pages), encoding="utf-8")
    return path


def model_folder(preset: str, corpus: Path, out: Path) -> Path:
    """The preset's config.json and a BPE tokenizer trained on the corpus (at most the preset's vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainmem import ModelSpec

    spec = ModelSpec.resolve(preset)
    folder = out / f"model-{preset}"
    folder.mkdir(parents=True, exist_ok=True)
    spec.hf_config().save_pretrained(folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=min(spec.vocab_size, 8192),
                                                  special_tokens=["<pad>", "<eos>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(folder)
    return folder


def trainmem(*args: str) -> dict:
    """One `trainmem` command in a fresh process; its JSON row."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "trainmem", *args, "--json"], capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"status": "error", "error": (done.stderr or done.stdout).strip().splitlines()[-1:], "memory": {}}
    return json.loads(lines[-1])


def main(out: Path, device: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    corpus = text(out)
    rows = []
    for preset, peft, batch in (CPU if device == "cpu" else SETUPS):
        folder = model_folder(preset, corpus, out)
        flags = ["--model", str(folder), "--data", str(corpus), "--peft", peft, "--batch-size", str(batch), *BASE]
        if device == "cpu":
            flags = [f for f in flags] + ["--attention", "eager"]
            flags[flags.index("--seq-len") + 1] = "64"
            flags[flags.index("--precision") + 1] = "fp32"
        measured = trainmem("run", *flags, "--device", device)
        steps = flags.index("--steps")
        estimated = trainmem("estimate", *flags[:steps], *flags[steps + 2:], "--gpu", "H100")
        for name, row in (("measured", measured), ("estimates", estimated)):
            with open(out / f"sft-{name}.jsonl", "a") as f:
                f.write(json.dumps({"preset": preset, "peft": peft, "batch": batch, **row}) + "\n")
        rows.append((preset, peft, batch, measured, estimated))
    print(f"{'model':14} {'peft':5} {'b':>2} " + " ".join(f"{k + ' est/meas MiB (err)':>40}"
                                                        for k in ("peak_allocated", "peak_reserved")))
    for preset, peft, batch, m, e in rows:
        cells = []
        for k in ("peak_allocated", "peak_reserved"):
            got, want = e.get("memory", {}).get(k), m.get("memory", {}).get(k)
            err = f"{(got - want) / want * 100:+6.1f}%" if got and want else "   n/a"
            cells.append(f"{(got or 0) / 2**20:10.1f} / {(want or 0) / 2**20:10.1f} ({err})")
        status = m.get("status"), e.get("status", "ok")
        print(f"{preset:14} {peft:5} {batch:>2} " + " ".join(f"{c:>40}" for c in cells) + f"  {status}"
              + (f" {m.get('error')}" if m.get("status") != "ok" else ""))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    dev = args[args.index("--device") + 1] if "--device" in args else "cuda"
    sys.exit(main(Path(args[0]), dev))
