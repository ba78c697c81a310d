"""TRL's SFTConfig as `--training-args` (read without TRL) and `--engine sft` (TRL's SFTTrainer, where installed)."""

import importlib.util
import json

import pytest

from trainmem import ModelSpec, SetupError, TrainSetup
from trainmem.config.sources import load_setup, read_training_arguments
from trainmem.measure.build import environment_problems

SPEC = ModelSpec.resolve("tiny-llama")


def _file(tmp_path, fields, name="sft.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps(fields) if name.endswith(".json") else
                    "".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    return str(path)


def test_an_sft_config_maps_onto_the_setup(tmp_path):
    path = _file(tmp_path, {"max_length": 256, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8,
                            "use_liger_kernel": True, "optim": "adamw_torch_fused", "completion_only_loss": True,
                            "assistant_only_loss": False, "dataset_text_field": "text", "loss_type": "dft"})
    _, setup = load_setup("tiny-llama", {}, training_args=path)
    # SFTConfig's own defaults: gradient checkpointing on, bf16 autocast unless fp16, learning rate 2e-5
    assert (setup.seq_len, setup.batch_size, setup.grad_accum, setup.kernels, setup.optimizer, setup.checkpointing,
            setup.precision, setup.lr, setup.data_mode, setup.engine) == (256, 4, 8, "liger", "adamw-fused", True,
                                                                          "amp-bf16", 2e-5, "pad", "sft")
    json_path = _file(tmp_path, {"max_length": 128, "fp16": True, "gradient_checkpointing": False}, "sft.json")
    _, setup = load_setup("tiny-llama", {"batch_size": "2"}, training_args=json_path)
    assert (setup.seq_len, setup.precision, setup.checkpointing, setup.batch_size) == (128, "amp-fp16", False, 2)


def test_a_training_arguments_file_keeps_trainers_defaults(tmp_path):
    _, setup = load_setup("tiny-llama", {}, training_args=_file(tmp_path, {"per_device_train_batch_size": 3},
                                                                "args.json"))
    assert (setup.checkpointing, setup.precision, setup.seq_len, setup.engine) == (False, "auto", TrainSetup.seq_len,
                                                                                   "loop")


def test_packing_is_the_pack_data_mode(tmp_path):
    path = _file(tmp_path, {"max_length": 64, "packing": True, "per_device_train_batch_size": 2})
    values = read_training_arguments(path)  # what --data X --data-mode pack --seq-len 64 would set
    assert (values["data_mode"], values["seq_len"], values["batch_size"]) == ("pack", 64, 2)
    # without --data every dummy row is max_length tokens, a full packed row: the same batch as the pad mode's
    _, dummy = load_setup("tiny-llama", {}, training_args=path)
    _, flags = load_setup("tiny-llama", {"seq_len": "64", "batch_size": "2", "checkpointing": "true",
                                         "precision": "amp-bf16", "lr": "2e-5", "optimizer": "adamw-fused",
                                         "seed": "42", "engine": "sft"})  # Trainer's optim and seed
    assert dummy == flags and dummy.data_mode == "pad"
    config = tmp_path / "setup.yaml"  # a pack mode asked for by name, not by packing, still needs --data
    config.write_text("data_mode: pack\n")
    with pytest.raises(SetupError, match="--data-mode: only applies to --data files"):
        load_setup("tiny-llama", {}, config=str(config), training_args=path)


def test_bad_and_unpriced_fields_are_one_line_each(tmp_path):
    path = _file(tmp_path, {"max_length": "long", "warp_speed": 9, "packing": "yes please"}, "bad.json")
    with pytest.raises(SetupError) as e:
        load_setup("tiny-llama", {}, training_args=path)
    assert e.value.problems == [
        f"--training-args: unknown TrainingArguments or SFTConfig field 'warp_speed' in {path}",
        f"--training-args: max_length in {path}: expected a whole number, got 'long'",
        f"--training-args: packing in {path}: expected true or false, got 'yes please'"]
    path = _file(tmp_path, {"max_length": 100, "padding_free": True, "activation_offloading": True,
                            "model_init_kwargs": {"dtype": "bfloat16"}, "pad_to_multiple_of": 64}, "unpriced.json")
    with pytest.raises(SetupError) as e:
        load_setup("tiny-llama", {}, training_args=path)
    assert [p.split(":")[1].split(" in ")[0].strip() for p in e.value.problems] == [
        "padding_free", "activation_offloading", "model_init_kwargs", "pad_to_multiple_of"]
    assert all(p.startswith("--training-args: ") and "\n" not in p for p in e.value.problems)
    _, setup = load_setup("tiny-llama", {}, training_args=_file(  # with packing, padding-free rows are full rows
        tmp_path, {"max_length": 128, "packing": True, "padding_free": True, "pad_to_multiple_of": 64}))
    assert setup.seq_len == 128


def test_engine_sft_without_trl_says_how_to_install_it(monkeypatch):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else find(name, *a))
    assert environment_problems(TrainSetup(engine="sft"), "cpu", "fp32") == [
        "--engine sft: needs TRL, which is not installed (pip install 'trainmem[trl]'); or use --engine trainer"]


def test_engine_sft_matches_engine_loop():
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from trainmem.isolation.engines import execute

    setup = TrainSetup(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu")
    loop, sft = execute(SPEC, setup), execute(SPEC, setup.replace(engine="sft"))
    assert loop.status == sft.status == "ok", sft.error
    assert sft.model_states == loop.model_states and sft.memory["weights"] == loop.memory["weights"]
    assert sft.setup["engine"] == "sft" and sft.steps_done == 2
    assert [p["phase"] for p in sft.phases] == [p["phase"] for p in loop.phases]
    assert any("fused LM head" in n for n in sft.notes)
