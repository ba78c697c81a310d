"""`trainmem run --engine sft`: the experiment trained by TRL's `SFTTrainer`, measured by `MemoryCallback`.

The samples are trainmem's own (dummy rows or `--data`, padded or packed by `--data-mode`), handed to
SFTTrainer already tokenized (`skip_prepare_dataset`), so TRL's collator only stacks and pads them: the same
batches as the loop's, labels included. What TRL itself changes stays: its fused LM head (`add_fused_lm_head`)
scores the labelled positions tile by tile and never builds the `(batch, seq_len, vocab)` logits, and with
`use_liger_kernel` it turns Liger's fused linear cross-entropy off for its own head. The estimate of an sft setup
prices that head as CUDA runs it (`estimator/memory/trlhead.py`); on the CPU, TRL folds each tile with torch ops
instead of its Triton kernel, and the run says so in its notes.
"""

from __future__ import annotations

import tempfile
from typing import Any

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.integrations.trainer import MemoryCallback, train_measured
from trainmem.result import Result

FUSED_HEAD_NOTE = ("--engine sft on the CPU: TRL's fused LM head folds each (tokens x vocabulary) tile with torch "
                   "ops, whose temporaries a CUDA run (a Triton kernel) and so trainmem's estimate do not hold")
"""The part of TRL's training that the estimate does not model, said on every `--engine sft` result on the CPU."""


def _tokenizer(spec: ModelSpec, setup: TrainSetup, pad_id: int) -> Any:
    """The model's tokenizer where `--data` needed it; otherwise a two-word stand-in whose pad id is `pad_id`:
    SFTTrainer wants a tokenizer for its pad id alone, and a preset or config.json has none."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if setup.data is not None:
        tok = AutoTokenizer.from_pretrained(spec.path)
        if tok.pad_token_id is None:
            tok.pad_token_id = pad_id
        return tok
    from tokenizers import Tokenizer, models

    words = {"<pad>": pad_id, "<unk>": pad_id + 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<unk>")),
                                   pad_token="<pad>", unk_token="<unk>")


def train_with_sft(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> Result:
    """The experiment of `trainmem run`, trained by TRL's `SFTTrainer` and measured by MemoryCallback."""
    import pyarrow as pa
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trainmem.measure.build import build_model
    from trainmem.measure.data import load_dataset

    samples, pad_id = load_dataset(spec, setup)
    # a fingerprint given, not hashed from the table: datasets 5.2's hash of a pyarrow table fails here (it pickles
    # pyarrow's MonthDayNano type by a name that does not resolve), and trainmem's samples are made, not cached
    rows = Dataset(pa.Table.from_pylist([{k: v.tolist() for k, v in s.items() if k != "attention_mask"}
                                         for s in samples]), fingerprint=f"trainmem-{len(samples)}-{setup.seed}")
    model = build_model(spec, setup, device, precision)
    callback = MemoryCallback(spec=spec, cap=setup.cap_bytes(precision), engine="sft")
    with tempfile.TemporaryDirectory(prefix="trainmem-sft-") as tmp:
        args = setup.replace(device=device, precision=precision).to_training_arguments(
            tmp, SFTConfig, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
            max_length=setup.seq_len, packing=False, dataset_kwargs={"skip_prepare_dataset": True})
        trainer = SFTTrainer(model=model, args=args, train_dataset=rows,
                             processing_class=_tokenizer(spec, setup, pad_id))
        result = train_measured(trainer, callback, setup.replace(device=device, precision=precision))
    if device == "cpu":
        result.notes.append(FUSED_HEAD_NOTE)
    if setup.lr_note():
        result.notes.append(setup.lr_note())
    return result


__all__ = ["train_with_sft", "FUSED_HEAD_NOTE"]
