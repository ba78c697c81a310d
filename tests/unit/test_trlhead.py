"""`--engine sft` priced as TRL's SFTTrainer trains: the fused LM head's stand-in (`estimator/memory/trlhead.py`)
allocates and saves what TRL 1.16's `ChunkedLogProbFunction` does, checked against the real function on the CPU
under the same tensor ledger, and an estimate of an SFT setup against a CPU `run --engine sft` of it."""

from __future__ import annotations

import pytest
import torch

from trainmem import ModelSpec, TrainSetup
from trainmem.estimator import estimate
from trainmem.estimator.memory import trlhead
from trainmem.measure.ledger import StateBytes, TensorLedger

SPEC = ModelSpec.resolve("tiny-llama")


def _ledger() -> TensorLedger:
    return TensorLedger(lambda: StateBytes(0, 0, 0)).record()


def _head(function, device, tokens, hidden, vocab, head_trains):
    """One forward and backward of `function` under a ledger: (bytes live after the forward, the saved
    tensors' (shape, dtype), the outputs', bytes live after the backward, the gradients' (shape, dtype))."""
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, requires_grad=True)
    w = torch.randn(vocab, hidden, device=device, requires_grad=head_trains)
    targets = torch.randint(vocab, (tokens,), device=device)
    ledger = _ledger()
    ledger.adopt([x, w, targets])
    ledger.events.clear()
    with ledger:
        out = function(x, w, targets)
        after_forward = ledger.live
        saved = [(tuple(t.shape), t.dtype) for t in out[0].grad_fn.saved_tensors if t is not None]
        outputs = [(tuple(t.shape), t.dtype) for t in out if t is not None]
        grads = torch.autograd.grad(out[0], [x, w] if head_trains else [x], torch.ones_like(out[0]))
        after_backward = ledger.live
    return after_forward, saved, outputs, after_backward, [(tuple(g.shape), g.dtype) for g in grads]


@pytest.mark.parametrize("head_trains", [False, True])
def test_the_stand_in_saves_and_holds_what_trls_function_does_on_the_cpu(head_trains):
    kernels = pytest.importorskip("trl.kernels")
    tokens, hidden, vocab = 70, 16, 33000  # two vocabulary tiles of 32768 columns
    real = _head(lambda x, w, t: kernels.ChunkedLogProbFunction.apply(
        x, w, None, t, 1.0, trlhead.VOCAB_CHUNK, None, 1.0, ("log_probs", "entropy", "is_top1")),
        "cpu", tokens, hidden, vocab, head_trains)
    stand_in = _head(trlhead.ChunkedLogProb.apply, "meta", tokens, hidden, vocab, head_trains)
    # TRL saves (hidden, weight, bias None, targets, log_z, entropy); outputs log_probs, entropy, is_top1
    assert stand_in[1] == real[1] == [((tokens, hidden), torch.float32), ((vocab, hidden), torch.float32),
                                      ((tokens,), torch.int64), ((tokens,), torch.float32), ((tokens,), torch.float32)]
    assert stand_in[2] == real[2]
    assert stand_in[0] == real[0]  # the bytes the forward leaves live: its outputs and log_z, to the byte
    # after the backward: the gradients in their inputs' dtypes; the CPU fold leaves a scalar or two behind
    assert 0 <= real[3] - stand_in[3] <= 16 and stand_in[4] == real[4]


def test_the_tile_buffer_is_32768_columns_wide_whatever_the_vocabulary():
    assert trlhead.buffer_bytes(62, torch.float32) == 62 * 32768 * 4
    assert trlhead.buffer_bytes(8192, torch.bfloat16) == 4096 * 32768 * 2


def test_an_sft_estimate_prices_the_fused_head_as_a_cpu_sft_run_measures_it():
    """The CPU run's activations equal the estimate's (a few scalar tensors apart); its peak is the estimate's
    (less the two cuBLAS workspaces the CPU has none of) plus the temporaries of TRL's torch fold, which the CPU
    runs where CUDA runs a Triton kernel that allocates nothing: at most eight (tokens x vocabulary) fp32 tiles."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from trainmem.isolation.engines import execute

    setup = TrainSetup(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu", precision="fp32",
                       attention="eager", engine="sft")
    b, loop = estimate(SPEC, setup), estimate(SPEC, setup.replace(engine="loop"))
    r = execute(SPEC, setup)
    assert r.status == "ok", r.error
    assert abs(b.memory["activations"] - r.memory["activations"]) <= 128
    tokens, vocab = setup.batch_size * (setup.seq_len - 1), SPEC.config["vocab_size"]
    gap = r.memory["peak_allocated"] - (b.terms["simulated_peak"] - b.terms["cublas_workspace"])
    assert 0 <= gap <= 8 * tokens * vocab * 4, gap
    assert gap < trlhead.buffer_bytes(tokens, torch.float32)  # the tile buffer itself is priced
    assert trlhead.NOTE in b.notes and trlhead.NOTE not in loop.notes
    assert b.memory["activations"] < loop.memory["activations"] or b.peak_phase != loop.peak_phase


def test_an_sft_config_file_makes_the_estimate_price_the_fused_head(tmp_path):
    from trainmem.config.sources import load_setup

    path = tmp_path / "sft.yaml"
    path.write_text("max_length: 64\nper_device_train_batch_size: 2\n")
    _, setup = load_setup("tiny-llama", {}, training_args=str(path))
    assert setup.engine == "sft"
    b = estimate(SPEC, setup)
    assert b.method == "simulate" and trlhead.NOTE in b.notes
    with pytest.raises(Exception, match="--method analytic: does not model --engine sft"):
        estimate(SPEC, setup, "analytic")
