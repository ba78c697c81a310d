"""`run --engine deepspeed --precision amp-bf16` on CUDA: DeepSpeed's engine turns an autocast it finds around its
forward off unless its own config enables one (`deepspeed.runtime.torch_autocast.autocast_if_enabled`, which asks
`torch.is_autocast_enabled()`, CUDA's); trainmem's config enables it, so the model's forward runs under bf16
autocast. On a CPU the check never fires (it asks CUDA's autocast), so only a GPU can tell."""

from __future__ import annotations

import pytest
import torch

from trainmem import ModelSpec, TrainSetup
from trainmem.isolation.engines import execute

pytestmark = pytest.mark.gpu
pytest.importorskip("deepspeed")


def test_amp_bf16_runs_the_engines_forward_under_autocast(monkeypatch):
    from transformers.models.llama import modeling_llama

    seen = []
    forward = modeling_llama.LlamaForCausalLM.forward

    def spy(self, *args, **kwargs):
        seen.append((torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")))
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(modeling_llama.LlamaForCausalLM, "forward", spy)
    setup = TrainSetup(gpus=2, shard="zero2", rank=0, batch_size=2, seq_len=32, steps=2, num_samples=8,
                       device="cuda", precision="amp-bf16", engine="deepspeed")
    r = execute(ModelSpec.resolve("tiny-llama"), setup)
    assert r.status == "ok", r.error
    assert seen and all(s == (True, torch.bfloat16) for s in seen)
