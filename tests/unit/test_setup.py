import dataclasses

import pytest

from trainmem import ModelSpec, SetupError, TrainSetup, find_gpu
from trainmem.config.sources import parse_bytes


def test_defaults_mirror_the_seed():
    s = TrainSetup()
    assert (s.batch_size, s.grad_accum, s.seq_len, s.num_samples) == (4, 1, 256, 64)
    assert (s.lora_r, s.lora_alpha, s.lora_dropout, s.optimizer) == (8, 32, 0.05, "adamw")
    assert TrainSetup(batch_size=4, grad_accum=4).effective_batch == 16


def test_all_problems_reported_at_once():
    spec = ModelSpec.resolve("tiny-gpt-neox")
    with pytest.raises(SetupError) as e:
        TrainSetup(batch_size=0, grad_accum=0, seq_len=4096, peft="adapter", gpu="T5",
                   optimizer="lion").validate(spec)
    msg = str(e.value)
    for needle in ("--batch-size: must be a whole number >= 1, got 0", "--grad-accum", "--peft: 'adapter'",
                   "--gpu: unknown card 'T5'", "--optimizer: 'lion'",
                   "--seq-len: 4096 is longer than tiny-gpt-neox's 512 positions; use --seq-len 512 or less"):
        assert needle in msg
    assert len(e.value.problems) == 6


def test_contradictory_and_missing_data_flags(tmp_path):
    problems = TrainSetup(lora_targets=["q_proj"], data_mode="pack").problems()
    assert "--lora-targets: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop --lora-targets" \
        in problems
    assert any("--data-mode: only applies to --data" in p for p in problems)
    problems = TrainSetup(data=str(tmp_path / "missing.txt")).problems()
    assert problems == [f"--data: no such file {str(tmp_path / 'missing.txt')!r}"]
    csv = tmp_path / "x.csv"
    csv.write_text("a,b")
    assert "must be a .txt" in TrainSetup(data=str(csv)).problems()[0]


def test_data_needs_a_tokenizer(text_file):
    problems = TrainSetup(data=str(text_file)).problems(ModelSpec.resolve("tiny-llama"))
    assert any("has no tokenizer" in p and "local model folder" in p for p in problems)


def test_gpu_catalog_and_cap():
    t4 = find_gpu("t4")
    assert t4 is find_gpu("T4")
    assert find_gpu("a100_80gb").name == "A100-80GB"
    assert TrainSetup(gpu="T4").cap_bytes() == t4.capacity - t4.context
    # the cap leaves out what the setup has outside the allocator: a step that reserves all of it
    # needs the card's capacity exactly
    for setup in (TrainSetup(gpu="T4", attention="sdpa", precision="fp16"),
                  TrainSetup(gpu="T4", attention="sdpa", precision="fp16", peft="qlora"),
                  TrainSetup(gpu="T4", attention="eager", precision="fp16")):
        assert setup.cap_bytes() + t4.overhead(setup.attention, setup.precision, setup.peft) == t4.capacity
    assert TrainSetup(gpu="T4", attention="sdpa", precision="fp16").cap_bytes() < t4.capacity - t4.context
    assert TrainSetup(gpu="T4", memory_cap=1000).cap_bytes() == 1000


def test_parse_bytes():
    assert parse_bytes("12GiB") == parse_bytes("12gib") == 12 * 2**30
    assert parse_bytes("12.5GiB") == int(12.5 * 2**30)
    assert parse_bytes("12000MiB") == 12000 * 2**20
    assert parse_bytes("12GB") == 12 * 10**9 and parse_bytes("300MB") == 300 * 10**6
    assert parse_bytes("4096B") == 4096  # bytes, said so
    assert parse_bytes("12884901888") == 12 * 2**30  # a bare number is bytes from 1 MiB up
    for bare, example in (("12", "12GiB"), ("12.5", "12.5GiB"), ("16000", "16000MiB"), ("0", "12GiB")):
        with pytest.raises(ValueError, match=rf"^{bare} has no unit, and as bytes it is less than 1 MiB; write the "
                                             rf"unit, e\.g\. {example}$"):
            parse_bytes(bare)
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("lots")


def test_resolved_precision_follows_checkpoint_on_cuda():
    s = TrainSetup()
    assert s.resolved_precision(ModelSpec.resolve("polyglot-ko-1.3b"), "cuda") == "fp16"
    assert s.resolved_precision(ModelSpec.resolve("llama-3.2-1b"), "cuda") == "bf16"
    assert s.resolved_precision(ModelSpec.resolve("polyglot-ko-1.3b"), "cpu") == "fp32"


def test_from_training_arguments(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                             gradient_accumulation_steps=4, gradient_checkpointing=True,
                             learning_rate=3e-5, bf16=False, use_cpu=True)
    s = TrainSetup.from_dict(__import__("trainmem").from_training_arguments(args).to_dict())
    assert (s.batch_size, s.grad_accum, s.checkpointing, s.lr) == (4, 4, True, 3e-5)


def test_lr_tuned_for_another_effective_batch_is_not_silently_reused():
    assert TrainSetup(batch_size=4, grad_accum=4, lr=1e-4, lr_batch=16).lr_note() is None
    note = TrainSetup(batch_size=4, grad_accum=2, lr=1e-4, lr_batch=16).lr_note()
    assert "tuned for an effective batch of 16, this setup's is 8" in note and "--lr 5e-05" in note
    assert "--lr-batch" in TrainSetup(lr_batch=0).problems()[0]


def test_what_the_model_config_rules_out_is_found_before_building_and_with_the_rest():
    spec = ModelSpec.resolve("tiny-gpt-neox")
    with pytest.raises(SetupError) as e:
        TrainSetup(peft="lora", lora_targets=["q_proj"], precision="bf16", gpu="T4", batch_size=0).validate(spec)
    [targets] = [p for p in e.value.problems if p.startswith("--lora-targets")]
    assert "no adaptable module named 'q_proj'; the model would have no trainable parameters" in targets
    assert "query_key_value" in targets  # the fix: what it can adapt
    assert any(p.startswith("--precision bf16: the T4") for p in e.value.problems)
    assert any(p.startswith("--batch-size") for p in e.value.problems) and len(e.value.problems) == 3
    assert TrainSetup(peft="lora", lora_targets=["query_key_value", "dense"]).problems(spec) == []


def test_a_setup_is_validated_once_on_its_way_from_the_flags_to_the_row(monkeypatch, capsys):
    from trainmem.cli import main

    calls = []
    checked = TrainSetup.problems
    monkeypatch.setattr(TrainSetup, "problems", lambda self, spec=None: calls.append(spec) or checked(self, spec))
    assert main(["run", "--model", "tiny-gpt-neox", "--device", "cpu", "--seq-len", "8", "--batch-size", "1",
                 "--steps", "1", "--num-samples", "1", "--no-isolate", "--json"]) == 0
    assert '"status": "ok"' in capsys.readouterr().out
    # once against the model; before it, the setup's own problems once, so that a mistyped value is answered
    # before the model is built (config.sources.load_setup)
    assert len([spec for spec in calls if spec is not None]) == 1 and calls[0] is None and len(calls) == 2


def test_every_setup_field_has_a_docstring():
    import ast
    import inspect

    from trainmem.config import setup

    [cls] = [n for n in ast.parse(inspect.getsource(setup)).body if getattr(n, "name", "") == "TrainSetup"]
    documented = {a.target.id for a, b in zip(cls.body, cls.body[1:])
                  if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}
    assert documented == {f.name for f in dataclasses.fields(TrainSetup)}
    strays = [b.lineno for a, b in zip(cls.body, cls.body[1:]) if isinstance(a, ast.Expr) and isinstance(b, ast.Expr)]
    assert strays == []  # no docstring stranded under another field's


def test_in_process_this_machines_problems_come_with_the_setups():
    from trainmem.isolation.engines import execute

    with pytest.raises(SetupError) as e:
        execute(ModelSpec.resolve("tiny-gpt-neox"), TrainSetup(batch_size=0, peft="qlora", device="cpu"))
    assert e.value.problems[0].startswith("--batch-size")
    assert any("4-bit NF4 training runs on CUDA only" in p for p in e.value.problems)


def test_default_lora_targets_leave_out_what_peft_refuses_and_the_towers(tmp_path):
    """Where peft has no default: a Mamba model's Linears but the mixers' out_proj (peft refuses it on Mamba),
    and a multimodal model's attention outside its vision and audio towers, as one regex peft matches against
    whole module names. peft accepts both, and adapts only what they say."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainmem.config.setup import default_lora_targets, lora_targets_note
    from trainmem.measure.build import add_adapters
    from lab import registry

    adapted = {}
    for t in ("mamba", "phi4_multimodal"):
        registry.tiny_config(t).save_pretrained(tmp_path / t)
        spec = ModelSpec.resolve(str(tmp_path / t / "config.json"))
        setup = TrainSetup(peft="lora", lora_r=4, seq_len=32).validate(spec)
        assert setup.lora_targets == default_lora_targets(spec)
        with torch.device("meta"):
            model = add_adapters(AutoModelForCausalLM.from_config(spec.hf_config()), setup)
        adapted[t] = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
        towers = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and ("vision" in n or "audio" in n)]
        assert not towers, towers
        assert lora_targets_note(spec, setup)
    assert adapted["mamba"] == {"in_proj", "x_proj", "dt_proj"}  # not out_proj
    assert adapted["phi4_multimodal"] == {"qkv_proj", "o_proj"}  # the towers' q/k/v/out_proj left out


def test_all_linear_leaves_out_what_peft_refuses_and_a_refused_target_is_one_line(tmp_path):
    """peft refuses LoRA on a Mamba mixer's out_proj and conv1d on the model types it lists (Falcon-H1 among
    them), and its all-linear would adapt out_proj: all-linear becomes every other Linear's name, which peft
    accepts; naming a refused module is a setup error naming --lora-targets. Jamba's mixers peft adapts."""
    import torch
    from transformers import AutoModelForCausalLM

    from lab import registry
    from trainmem.config.setup import all_linear_targets, lora_targets_note, peft_refused
    from trainmem.measure.build import add_adapters

    for t in ("falcon_h1", "jamba"):
        registry.tiny_config(t).save_pretrained(tmp_path / t)
    falcon, jamba = (ModelSpec.resolve(str(tmp_path / t / "config.json")) for t in ("falcon_h1", "jamba"))
    assert peft_refused(falcon) == ("conv1d", "out_proj") and peft_refused(jamba) == ()

    setup = TrainSetup(peft="lora", lora_r=4, seq_len=32, lora_targets=["all-linear"]).validate(falcon)
    assert setup.lora_targets == all_linear_targets(falcon)
    assert {"in_proj", "q_proj", "o_proj", "down_proj"} <= set(setup.lora_targets)
    assert not {"out_proj", "conv1d", "lm_head"} & set(setup.lora_targets)
    with torch.device("meta"):
        model = add_adapters(AutoModelForCausalLM.from_config(falcon.hf_config()), setup)
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == set(setup.lora_targets)
    assert "all-linear names every Linear layer but the output head and out_proj" in lora_targets_note(falcon, setup)

    for targets, fix in ((["out_proj"], "drop out_proj"), (["q_proj", "mamba.conv1d"], "drop mamba.conv1d"),
                         ([r"^.*\.(out_proj|q_proj)$"], "make the regex match no out_proj")):
        with pytest.raises(SetupError) as e:
            TrainSetup(peft="lora", seq_len=32, lora_targets=targets).validate(falcon)
        [line] = e.value.problems
        assert line.startswith("--lora-targets: peft refuses LoRA on ") and "falcon_h1 models" in line, line
        assert fix in line and "all-linear" in line, line
    with pytest.raises(SetupError) as e:  # the layers it lists as adaptable leave out what peft refuses
        TrainSetup(peft="lora", seq_len=32, lora_targets=["qproj"]).validate(falcon)
    assert "out_proj" not in e.value.problems[0] and "in_proj" in e.value.problems[0]

    for targets in (["all-linear"], ["out_proj"]):
        setup = TrainSetup(peft="lora", lora_r=4, seq_len=32, lora_targets=targets).validate(jamba)
        assert setup.lora_targets == targets
