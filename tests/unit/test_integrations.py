"""MemoryCallback in a real transformers Trainer on the CPU, `--engine trainer`, TrainingArguments I/O."""

import argparse
import json

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from trainmem import ModelSpec, SetupError, TrainSetup
from trainmem.integrations import MemoryCallback
from trainmem.integrations.trainer import _Samples
from trainmem.isolation.engines import execute
from trainmem.measure.build import build_model
from trainmem.measure.data import collate, dummy_dataset
from trainmem.measure.ledger import state_bytes
from trainmem.result import MEMORY_KEYS, SCHEMA

SPEC = ModelSpec.resolve("tiny-gpt-neox")
SETUP = TrainSetup(batch_size=2, seq_len=32, steps=3, num_samples=16, device="cpu")


class Recorder(TrainerCallback):
    """Stands in for a reporting integration (TensorBoard, W&B): keeps the keys each on_log saw."""

    def __init__(self):
        self.seen: list[set[str]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(set(logs))


def _trainer(tmp_path, callback, attach=True):
    model = build_model(SPEC, SETUP, "cpu", "fp32")
    recorder = Recorder()
    args = SETUP.to_training_arguments(str(tmp_path / "out"), report_to=[], logging_steps=1,
                                       save_strategy="no", disable_tqdm=True)
    data = _Samples(dummy_dataset(SETUP.num_samples, SETUP.seq_len, SPEC.vocab_size))
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate,
                      callbacks=[recorder] if attach else [recorder, callback])
    if attach:
        callback.attach(trainer)
    trainer.train()
    return trainer, model, recorder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainer")
    cb = MemoryCallback(out=str(tmp / "results.jsonl"), compare_estimate=True)
    trainer, model, recorder = _trainer(tmp, cb)
    return cb, trainer, model, recorder, tmp / "results.jsonl"


def test_model_states_are_exact(trained):
    cb, trainer, model, _, _ = trained
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    ms = cb.result.model_states
    assert ms["weights"] == 4 * n + buffers
    assert ms["gradients"] == 4 * n
    assert ms["optimizer"] == 8 * n + 4 * len(params)  # exp_avg, exp_avg_sq, a 4-byte step per tensor
    after = state_bytes(model, trainer.optimizer.optimizer)  # states outlive the run; grads were zeroed
    assert (after.weights, after.optimizer) == (ms["weights"], ms["optimizer"]) and after.gradients == 0
    assert cb.result.memory["weights"] == ms["weights"]


def test_activations_are_seen_through_the_trainer(trained):
    cb, _, _, _, _ = trained
    r = cb.result
    phases = {p["phase"]: p for p in r.phases}
    assert list(phases)[:4] == ["load", "step1.micro1.forward", "step1.micro1.backward", "step1.optimizer"]
    fwd = phases["step2.micro1.forward"]
    logits = SETUP.batch_size * SETUP.seq_len * SPEC.vocab_size * 4
    # After forward: weights and Adam states plus what forward keeps for backward, logits included.
    assert fwd["allocated"] - fwd["weights"] - fwd["optimizer"] >= logits
    assert r.memory["activations"] > 0
    parts = sum(r.memory[k] for k in ("weights", "gradients", "optimizer", "activations", "other"))
    assert parts == r.memory["peak_allocated"] > r.model_states["weights"] + r.model_states["optimizer"]
    assert r.steps_done == 3 and len(r.losses) == 3 and r.setup["engine"] == "trainer"
    assert (r.setup["batch_size"], r.setup["seq_len"], r.setup["precision"]) == (2, 32, "fp32")


def test_result_file_and_estimate(trained):
    cb, _, _, _, path = trained
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["measurement", "estimate"]
    assert all(r["schema"] == SCHEMA and set(MEMORY_KEYS) <= set(r["memory"]) for r in rows)
    assert rows[0] == cb.result.to_dict()
    peak = cb.relative_error["peak_allocated"]
    assert peak == pytest.approx(rows[1]["memory"]["peak_allocated"] / rows[0]["memory"]["peak_allocated"] - 1)
    assert any("trainmem estimate" in n for n in cb.result.notes)


def test_figures_reach_the_log_history_and_reporters(trained, tmp_path):
    cb, trainer, _, recorder, _ = trained
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 3 and all(h["trainmem/peak_allocated"] > 0 for h in steps)
    assert steps[-1]["trainmem/optimizer"] == cb.result.model_states["optimizer"]
    assert "trainmem/weights" in recorder.seen[0]
    # Appended after the reporters (callbacks=[...]) the history still gets them, reporters do not.
    late = MemoryCallback()
    trainer, _, recorder = _trainer(tmp_path, late, attach=False)
    assert "trainmem/weights" in trainer.state.log_history[0]
    assert "trainmem/weights" not in recorder.seen[0]


def test_engine_trainer_matches_engine_loop():
    loop = execute(SPEC, SETUP)
    trainer = execute(SPEC, SETUP.replace(engine="trainer"))
    assert loop.status == trainer.status == "ok", trainer.error
    assert trainer.model_states == loop.model_states
    assert trainer.setup["engine"] == "trainer" and trainer.memory["weights"] == loop.memory["weights"]
    assert trainer.steps_done == 3 and [p["phase"] for p in trainer.phases] == [p["phase"] for p in loop.phases]


def test_engine_is_validated():
    assert TrainSetup(engine="accelerate").problems() == [
        "--engine: 'accelerate' is not one of loop, trainer, sft, deepspeed"]


def test_training_arguments_round_trip(tmp_path):
    setup = TrainSetup(batch_size=3, grad_accum=2, checkpointing=True, precision="amp-bf16", optimizer="sgd",
                       lr=3e-5, seed=7, steps=5, device="cpu")
    args = setup.to_training_arguments(str(tmp_path))
    assert (args.bf16, args.fp16, args.optim, args.max_steps, args.use_cpu) == (True, False, "sgd", 5, True)
    back = TrainSetup.from_training_arguments(args, device="cpu")
    assert back == setup
    assert setup.replace(precision="amp-fp16").to_training_arguments(str(tmp_path)).fp16
    model = build_model(SPEC, TrainSetup(peft="lora", lora_r=4), "cpu", "fp32")
    lora = TrainSetup.from_training_arguments(TrainingArguments(str(tmp_path), use_cpu=True), model)
    assert (lora.peft, lora.lora_r, lora.lora_targets, lora.precision) == ("lora", 4, ["query_key_value"], "fp32")
    assert lora.optimizer == "adamw-fused"  # transformers 5's default optim with torch >= 2.8


def test_training_args_file_is_a_layer_under_flags(tmp_path):
    from trainmem.cli import estimate as estimate_cmd
    from trainmem.cli.options import setup_from_args

    path = tmp_path / "args.json"
    path.write_text(TrainingArguments(str(tmp_path), per_device_train_batch_size=8, gradient_accumulation_steps=4,
                                      bf16=True, learning_rate=2e-5, optim="adamw_torch",
                                      use_cpu=True).to_json_string())
    parser = argparse.ArgumentParser()
    estimate_cmd.register(parser)
    _, setup = setup_from_args(parser.parse_args(["--training-args", str(path), "--model", "tiny-gpt-neox",
                                                  "--batch-size", "2"]))
    assert (setup.batch_size, setup.grad_accum, setup.precision, setup.lr, setup.optimizer) == \
        (2, 4, "amp-bf16", 2e-5, "adamw")
    path.write_text(json.dumps({"per_device_train_batch_size": 2, "warp_speed": 9}))
    with pytest.raises(SetupError, match=r"--training-args: .*unknown TrainingArguments field 'warp_speed'"):
        setup_from_args(parser.parse_args(["--training-args", str(path), "--model", "tiny-gpt-neox"]))


def test_oom_under_a_cap_is_a_result():
    r = execute(SPEC, SETUP.replace(engine="trainer", memory_cap=3 * 2**20))
    assert r.status == "oom" and r.oom["tried_to_allocate"] > 0 and r.oom["phase"].startswith("step1")
    assert torch._C._len_torch_dispatch_stack() == 0  # the ledger was left, not stranded on the stack
