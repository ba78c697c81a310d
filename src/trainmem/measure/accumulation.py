"""Gradient accumulation done right: one implementation for `run` and `verify-accumulation`.

The loss of a window is the sum of token losses over all of its micro-batches divided by the number of
label tokens in the whole window (labels != -100 after the causal shift). Each micro-batch therefore
passes the window's token count to the Hugging Face loss as `num_items_in_batch`, which makes the loss
a sum over its tokens divided by that count; summing the micro-batch gradients then gives exactly the
gradient of the full batch. The seed instead divides each micro-batch's mean loss by the number of
steps ("naive"), which weights tokens of short micro-batches more. A trailing partial window is stepped
like any other, normalised by the tokens it really holds.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .data import IGNORE, Sample


def label_tokens(batch: Sample) -> int:
    """Tokens that contribute to the causal LM loss: labels after the shift that are not ignored."""
    return int((batch["labels"][:, 1:] != IGNORE).sum())


def windows(batches: list[Sample], grad_accum: int) -> list[list[Sample]]:
    """Split one epoch of micro-batches into accumulation windows; the last may be shorter."""
    return [batches[i:i + grad_accum] for i in range(0, len(batches), grad_accum)]


def endless_windows(batches: list[Sample], grad_accum: int) -> Iterator[list[Sample]]:
    """Windows epoch after epoch, each epoch ending with its partial window if it has one."""
    per_epoch = windows(batches, grad_accum)
    while True:
        yield from per_epoch


def micro_batch_loss(model: torch.nn.Module, batch: Sample, window_tokens: int,
                     naive_steps: int | None = None) -> torch.Tensor:
    """The loss to backpropagate for one micro-batch of a window.

    Correct: sum of this micro-batch's token losses / `window_tokens`. With `naive_steps`, the seed's
    rule instead: this micro-batch's mean token loss / `naive_steps`.
    """
    if naive_steps is None:
        out = model(**batch, num_items_in_batch=window_tokens)
        loss = out.loss
    else:
        out = model(**batch)
        loss = out.loss / naive_steps
    # Keep only the loss: the logits would otherwise stay alive until the next forward.
    del out
    return loss
