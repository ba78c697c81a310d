"""forked.at_once where a CUDA device exists: a backward in the process that forks starts autograd's device threads,
after which a forked child's backward fails; the pieces then run in the process, and answer all the same."""

from __future__ import annotations

import json

import pytest
import torch

from trainmem import ModelSpec, TrainSetup, forked
from trainmem.estimator import estimate

pytestmark = pytest.mark.gpu


def _grad(x: float) -> float:
    t = torch.ones(3, requires_grad=True)
    (t * x).sum().backward()
    return float(t.grad.sum())


def test_estimates_one_after_another_each_fork_their_pieces(tmp_path):
    """Two calls whose pieces run a backward, one after the other, then two estimates of a deep model (the checked
    advice after an estimate; a ZeRO-2 rank's cut models): the first call's pieces must leave this process able to
    fork again."""
    assert forked.at_once(_grad, [1.0, 2.0, 3.0]) == [3.0, 6.0, 9.0]
    assert forked.at_once(_grad, [1.0, 2.0]) == [3.0, 6.0]
    deep = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
            "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
            "max_position_embeddings": 256, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(deep))
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    setup = TrainSetup(batch_size=2, seq_len=64, gpus=4, shard="zero2", gpu="H100")
    assert estimate(spec, setup).memory == estimate(spec, setup).memory


def test_after_a_cuda_backward_here_the_pieces_run_here():
    x = torch.ones(3, device="cuda", requires_grad=True)
    x.sum().backward()
    assert forked._autograd_threads()
    assert forked.at_once(_grad, [1.0, 2.0]) == [3.0, 6.0]
