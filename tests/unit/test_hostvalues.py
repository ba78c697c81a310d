"""Host reads in a simulated step: values made from the batch alone are answered exactly from their CPU twins,
routing counts under the balanced-routing assumption (and said so), anything else is an UnknownValue."""

from __future__ import annotations

import pytest
import torch

from trainmem.estimator.memory.hostvalues import HostValues, UnknownValue


def test_values_made_from_the_batch_are_read_as_the_gpu_would():
    ids = torch.zeros((2, 8), dtype=torch.long, device="meta")
    with HostValues() as host:
        host.give(ids, torch.zeros((2, 8), dtype=torch.long))
        mask = torch.ones((2, 8), dtype=torch.long, device="meta")
        lengths = mask.sum(-1)
        assert bool(mask.bool().all()) and int(lengths.max()) == 8  # OPT's all-ones test, XLM's longest length
        assert (ids == 0).nonzero().shape == (16, 2) and lengths.tolist() == [8, 8]
        assert not host.balanced


def test_a_value_that_depends_on_weights_is_unknown():
    weight = torch.empty((4, 4), device="meta")
    with HostValues(), pytest.raises(UnknownValue, match="depends on its data"):
        float(weight.sum())


def test_routing_counts_read_on_the_host_follow_balanced_routing():
    logits = torch.empty((6, 4), device="meta")  # 6 tokens, 4 experts: the router's output, no twin
    with HostValues() as host:
        _, experts = logits.topk(2, dim=-1)
        counts = (experts.flatten()[:, None] == torch.arange(4, device="meta")).sum(0)
        assert not host.balanced
        assert counts.tolist() == [3, 3, 3, 3]  # JetMoE's expert_size.tolist(): 6 x 2 picks over 4 experts
        assert host.balanced
