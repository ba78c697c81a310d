"""`--kernels liger`: the stand-ins allocate and save what liger-kernel 0.8.5's kernels do (their sources:
`ops/fused_linear_cross_entropy.py`, `ops/rms_norm.py`, `ops/swiglu.py`, `ops/rope.py`), the simulated step
holds no logits, and the flag's refusals are one line each. Expected sizes are worked out here from the
kernels' rules, not read from the code under test."""

from __future__ import annotations

import pytest
import torch

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate
from trainmem.estimator.memory import liger
from trainmem.estimator.memory.simulate import model_builder, simulate_step
from trainmem.errors import SetupError
from trainmem.hardware.gpus import CATALOG
from trainmem.measure.build import environment_problems
from trainmem.measure.ledger import StateBytes, TensorLedger

META = {"device": "meta"}


def _ledger() -> TensorLedger:
    return TensorLedger(lambda: StateBytes(0, 0, 0)).record()


def _allocations(ledger: TensorLedger) -> list[int]:
    return [n for _, n in ledger.events if n > 0]


def test_chunk_rows_follow_liger_rule():
    # the worked example in fused_linear_cross_entropy_forward: BT = 4096*4, V = 32000, H = 4096 -> 2048 rows
    assert liger.chunk_rows(4096 * 4, 4096, 32000) == 2048
    # Llama-3's 128256 tokens over 4096 hidden: ceil(V/H) = 32 chunks' worth, 4096 tokens -> 128 rows
    assert liger.chunk_rows(4096, 4096, 128256) == 128
    assert liger.chunk_rows(3, 64, 100) == 2  # next power of two of ceil(3 / 2)
    assert liger.chunk_rows(5, 4096, 1000) == 5  # one chunk covers BT, never more than BT


@pytest.mark.parametrize("head_trains", [False, True])
def test_fused_loss_saves_the_gradients_and_holds_one_chunk_of_logits(head_trains):
    tokens, hidden, vocab = 512, 64, 1000
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16, requires_grad=True, **META)
    w = torch.empty(vocab, hidden, dtype=torch.bfloat16, requires_grad=head_trains, **META)
    target = torch.zeros(tokens, dtype=torch.long, **META)
    ledger = _ledger()
    ledger.adopt([x, w, target])  # the inputs' views are not new memory
    ledger.events.clear()
    with ledger:
        loss = liger._FusedLinearCrossEntropy.apply(x, w, target)
    rows = -(-tokens // -(-vocab // hidden))  # 512 / ceil(1000 / 64) = 32, already a power of two
    # grad_input (BT x H, bf16), grad_weight (V x H in the head's dtype) where the head trains, the fp32 loss_1d,
    # the ignore mask and its count, one chunk's logits (rows x V, bf16), the summed loss (fp32 scalar)
    head = [2 * vocab * hidden] if head_trains else []
    assert _allocations(ledger) == [2 * tokens * hidden, *head, 4 * tokens, tokens, 8, 2 * rows * vocab, 4]
    saved = loss.grad_fn.saved_tensors
    assert (saved[0].shape, saved[0].dtype) == ((tokens, hidden), torch.bfloat16)  # grad_input
    if head_trains:
        assert (saved[1].shape, saved[1].dtype) == ((vocab, hidden), torch.bfloat16)  # grad_weight, accum in bf16
    else:
        assert saved[1] is None
    assert loss.dtype == torch.float32 and loss.dim() == 0  # sum of the fp32 loss_1d
    seed = torch.empty_like(loss)  # the loss's 1 / num_items_in_batch, made outside the ledger
    backward = _ledger()
    with backward:
        (gx,) = torch.autograd.grad(loss, [x], seed)
    assert _allocations(backward) == [] and gx.shape == x.shape  # scaled in place: nothing new


def test_rms_norm_swiglu_rope_save_what_liger_saves():
    x = torch.empty(2, 8, 64, dtype=torch.bfloat16, requires_grad=True, **META)
    weight = torch.empty(64, dtype=torch.bfloat16, requires_grad=True, **META)
    y = liger._RMSNorm.apply(x, weight, 132)
    X, W, rstd = y.grad_fn.saved_tensors
    assert (X.shape, W.shape, rstd.shape, rstd.dtype) == (x.shape, (64,), (16,), torch.float32)
    dy = torch.empty_like(y)
    ledger = _ledger()
    ledger.adopt([dy])
    ledger.events.clear()
    with ledger:
        torch.autograd.grad(y, [x, weight], dy)
    # dX over dY; an fp32 (SMs x H) partial dW, its sum, and the cast to W's dtype
    assert _allocations(ledger) == [4 * 132 * 64, 4 * 64, 2 * 64]

    a = torch.empty(2, 8, 128, dtype=torch.bfloat16, requires_grad=True, **META)
    b = torch.empty(2, 8, 128, dtype=torch.bfloat16, requires_grad=True, **META)
    c = liger._SiLUMul.apply(a, b)
    assert [t.shape for t in c.grad_fn.saved_tensors] == [a.shape, b.shape]
    dc = torch.empty_like(c)
    ledger = _ledger()
    ledger.adopt([a, b, dc])
    ledger.events.clear()
    with ledger:
        torch.autograd.grad(c, [a, b], dc)
    assert _allocations(ledger) == []  # da, db written over a, b

    # q, k as transformers makes them: (batch, seq, heads, dim) storage seen as (batch, heads, seq, dim)
    q = torch.empty(2, 8, 4, 16, dtype=torch.bfloat16, requires_grad=True, **META).transpose(1, 2)
    k = torch.empty(2, 8, 2, 16, dtype=torch.bfloat16, requires_grad=True, **META).transpose(1, 2)
    cos = torch.empty(1, 8, 16, dtype=torch.bfloat16, **META)
    ledger = _ledger()
    ledger.adopt([q, k, cos])
    ledger.events.clear()
    with ledger:
        q2, k2 = liger._Rope.apply(q, k, cos, cos)
    assert _allocations(ledger) == [] and q2.shape == q.shape  # rotated in place
    assert [t.shape for t in q2.grad_fn.saved_tensors] == [cos.shape, cos.shape]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_simulated_step_holds_no_logits(name):
    spec = ModelSpec.resolve(name)
    vocab, hidden = spec.config["vocab_size"], spec.config["hidden_size"]
    setup = TrainSetup(batch_size=2, seq_len=96, peft="lora", precision="bf16")
    logits = 2 * setup.batch_size * setup.seq_len * vocab  # bf16 (batch, seq, vocab)
    plain, _ = simulate_step(model_builder(spec, setup, "bf16", CATALOG["H200"]), setup, "bf16")
    fused = setup.replace(kernels="liger")
    ledger, _ = simulate_step(model_builder(spec, fused, "bf16", CATALOG["H200"]), fused, "bf16")
    assert logits in _allocations(plain) and 2 * logits in _allocations(plain)  # logits, their fp32 upcast
    sizes = _allocations(ledger)
    assert logits not in sizes and 2 * logits not in sizes
    # Liger pads the labels instead of cutting the last position: all batch x seq tokens go to the loss
    rows = liger.chunk_rows(setup.batch_size * setup.seq_len, hidden, vocab)
    assert sizes.count(2 * rows * vocab) == 3  # one logits buffer per forward, three steps
    b_plain = estimate(spec, setup)
    b_fused = estimate(spec, fused)
    assert b_fused.memory["activations"] < b_plain.memory["activations"]
    assert any(n.startswith("--kernels liger:") for n in b_fused.notes)
    assert b_fused.setup["kernels"] == "liger"


def test_kernels_refusals_are_one_line_each():
    assert TrainSetup(kernels="ligr").problems() == [
        "--kernels: 'ligr' is not one of none, liger; did you mean liger?"]
    neox = ModelSpec.resolve("tiny-gpt-neox")
    (line,) = TrainSetup(kernels="liger").problems(neox)
    assert line.startswith("--kernels liger: trainmem models Liger's kernels for llama, mistral, qwen2, qwen3")
    assert "gpt_neox" in line and line.endswith("use --kernels none")
    (line,) = TrainSetup(kernels="liger", gpus=2, shard="ddp").problems()
    assert line.startswith("--kernels liger: modelled on one GPU")
    cpu = environment_problems(TrainSetup(kernels="liger"), "cpu", "fp32")
    assert cpu == ["--kernels liger: Liger's kernels are Triton kernels, which run on CUDA only; use --device cuda "
                   "or --kernels none"]
    with pytest.raises(SetupError) as e:
        estimate(ModelSpec.resolve("tiny-llama"), TrainSetup(kernels="liger"), "analytic")
    assert str(e.value).count("\n") == 0 and "--method analytic" in str(e.value)
