"""Training data: the seed's dummy dataset, or local text tokenized with the model's own tokenizer.

Every sample is a dict of 1-D tensors (`input_ids`, `labels`, and `attention_mask` for padded text);
`collate` pads a list of them into a micro-batch. Padded text gives micro-batches with uneven numbers
of label tokens, which is what makes correct gradient accumulation matter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trainmem.errors import SetupError

IGNORE = -100  # label value that the Hugging Face loss skips

Sample = dict[str, torch.Tensor]


def dummy_dataset(n: int, seq_len: int, vocab_size: int, labels: str = "random", seed: int = 0) -> list[Sample]:
    """The seed's `make_dummy_dataset`: `n` samples of `seq_len` random ids in [100, 30000).

    The range is clipped to the vocabulary for small models (tiny presets have 1024 ids). With
    `labels="random"` labels are independent random ids as in the seed; `"copy"` uses the inputs.
    """
    low, high = min(100, vocab_size // 10), min(30000, vocab_size)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, high, (n, seq_len), generator=g)
    lab = torch.randint(low, high, (n, seq_len), generator=g) if labels == "random" else ids.clone()
    return [{"input_ids": ids[i], "labels": lab[i]} for i in range(n)]


def read_texts(path: str | Path) -> list[str]:
    """Non-empty lines of a .txt file, or the "text" fields of a .jsonl file."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SetupError([f"--data: cannot read {str(p)!r}: {e}"]) from None
    if p.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise SetupError([f"--data: {p.name} line {n} is not JSON: {e}"]) from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise SetupError([f"--data: {p.name} line {n} has no string field 'text'"])
            texts.append(row["text"])
    else:
        texts = [line for line in raw.splitlines() if line.strip()]
    if not texts:
        raise SetupError([f"--data: {str(p)!r} holds no text samples"])
    return texts


def text_dataset(path: str | Path, tokenizer: Any, seq_len: int, mode: str = "pad") -> list[Sample]:
    """Tokenize a local text file: one sample per text (`pad`) or fixed blocks of `seq_len` (`pack`)."""
    texts = read_texts(path)
    encoded = [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
    if mode == "pad":
        samples = [torch.tensor(ids[:seq_len]) for ids in encoded if len(ids) >= 2]
    else:
        eos = tokenizer.eos_token_id
        stream: list[int] = []
        for ids in encoded:
            stream += list(ids) + ([eos] if eos is not None else [])
        samples = [torch.tensor(stream[i:i + seq_len]) for i in range(0, len(stream), seq_len)]
        samples = [s for s in samples if len(s) >= 2]
    if not samples:
        raise SetupError([f"--data: {str(path)!r} has no sample of 2 or more tokens"])
    return [{"input_ids": s, "labels": s.clone()} for s in samples]


def collate(samples: list[Sample], pad_id: int = 0) -> Sample:
    """Stack samples into a batch, right-padding uneven ones (attention mask 0, labels -100)."""
    lengths = [len(s["input_ids"]) for s in samples]
    longest = max(lengths)
    if all(n == longest for n in lengths) and all("attention_mask" not in s for s in samples):
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, (s, n) in enumerate(zip(samples, lengths)):
        ids[i, :n], labels[i, :n], mask[i, :n] = s["input_ids"], s["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def micro_batches(dataset: list[Sample], batch_size: int, pad_id: int = 0) -> list[Sample]:
    """One epoch of micro-batches in order; the last one may be smaller (nothing is dropped)."""
    return [collate(dataset[i:i + batch_size], pad_id) for i in range(0, len(dataset), batch_size)]


def load_dataset(spec: Any, setup: Any) -> tuple[list[Sample], int]:
    """(samples, pad id) for the setup: the seed's dummy data or a tokenized local file."""
    if setup.data is None:
        return dummy_dataset(setup.dummy_samples(), setup.seq_len, spec.vocab_size, setup.labels, setup.seed), 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec.path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    return text_dataset(setup.data, tok, setup.seq_len, setup.data_mode), pad
