import json

import pytest

from trainmem import SetupError
from trainmem.measure.accumulation import label_tokens, windows
from trainmem.measure.data import (
    IGNORE,
    collate,
    dummy_dataset,
    micro_batches,
    read_texts,
    text_dataset,
)


def test_dummy_dataset_is_the_seeds():
    ds = dummy_dataset(64, 256, vocab_size=30080)
    assert len(ds) == 64 and ds[0]["input_ids"].shape == (256,) and "attention_mask" not in ds[0]
    ids = [int(x) for s in ds for x in s["input_ids"]]
    assert min(ids) >= 100 and max(ids) < 30000
    assert not all((s["input_ids"] == s["labels"]).all() for s in ds)  # independent random labels
    copy = dummy_dataset(4, 16, 30080, labels="copy")
    assert all((s["input_ids"] == s["labels"]).all() for s in copy)


def test_dummy_ids_fit_a_tiny_vocab():
    ds = dummy_dataset(8, 32, vocab_size=1024)
    assert max(int(s["input_ids"].max()) for s in ds) < 1024


def test_collate_pads_with_mask_and_ignored_labels():
    import torch

    a = {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([5, 6, 7])}
    b = {"input_ids": torch.tensor([8]), "labels": torch.tensor([8])}
    batch = collate([a, b], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, IGNORE, IGNORE]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert label_tokens(batch) == 2  # after the shift: 6, 7 of the first row; nothing of the second


def test_micro_batches_keep_the_last_partial_one_and_windows_too():
    ds = dummy_dataset(10, 8, 1024)
    mbs = micro_batches(ds, 4)
    assert [b["input_ids"].shape[0] for b in mbs] == [4, 4, 2]
    assert [len(w) for w in windows(mbs, 2)] == [2, 1]


def test_text_pad_and_pack(model_dir, text_file):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    padded = text_dataset(text_file, tok, seq_len=8, mode="pad")
    assert len({len(s["input_ids"]) for s in padded}) > 1  # uneven lengths
    assert max(len(s["input_ids"]) for s in padded) <= 8
    packed = text_dataset(text_file, tok, seq_len=8, mode="pack")
    assert all(len(s["input_ids"]) == 8 for s in packed[:-1])


def test_read_texts_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(SetupError, match="holds no text samples"):
        read_texts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{oops\n")
    with pytest.raises(SetupError, match="line 2 is not JSON"):
        read_texts(bad)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text(json.dumps({"content": "x"}) + "\n")
    with pytest.raises(SetupError, match="no string field 'text'"):
        read_texts(nofield)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "a b"}) + "\n" + json.dumps({"text": "c"}) + "\n")
    assert read_texts(good) == ["a b", "c"]
