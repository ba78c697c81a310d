"""A corpus of bad inputs: each ends in one line per problem naming its flag, field or file, and an exit status
(2: a setup that cannot run; 1: a run that failed or an internal error; 130: interrupted), never a traceback.
And inputs near them that must be accepted, and read right (`checkpointing: true`, `gpu: 4090`).

The CLI runs in this process (`trainmem.cli.main` with capsys); most inputs fail in validation before anything
heavy runs, and those that estimate use `--method analytic` on tiny presets. A few cases need a real process:
Ctrl-C, and the warnings of a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from trainmem.cli import main

TINY = ["--model", "tiny-gpt-neox"]
FAST = ["--method", "analytic"]
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 1024, "max_position_embeddings": 512}

FILES: dict[str, str] = {
    # --config FILE.yaml
    "model-int.yaml": "model: 12\n",
    "null.yaml": "model: tiny-gpt-neox\nbatch_size: null\n",
    "ckpt-no.yaml": "model: tiny-gpt-neox\ncheckpointing: 'no'\n",
    "ckpt-yes-text.yaml": "model: tiny-gpt-neox\ncheckpointing: \"yes\"\n",
    "ckpt-one.yaml": "model: tiny-gpt-neox\ncheckpointing: 1\n",
    "batch-float.yaml": "model: tiny-gpt-neox\nbatch_size: 4.7\n",
    "batch-bool.yaml": "model: tiny-gpt-neox\nbatch_size: true\n",
    "lr-inf.yaml": "model: tiny-gpt-neox\nlr: .inf\n",
    "lr-nan.yaml": "model: tiny-gpt-neox\nlr: .nan\n",
    "lr-text.yaml": "model: tiny-gpt-neox\nlr: fast\n",
    "dropout-list.yaml": "model: tiny-gpt-neox\nlora_dropout: []\n",
    "peft-no.yaml": "model: tiny-gpt-neox\npeft: no\n",
    "peft-int.yaml": "model: tiny-gpt-neox\npeft: 3\n",
    "unknown-key.yaml": "model: tiny-gpt-neox\nwidth: 3\n",
    "int-key.yaml": "model: tiny-gpt-neox\n1: 2\n",
    "list.yaml": "- batch_size: 4\n",
    "broken.yaml": "batch_size: [\n",
    "empty.yaml": "",
    "targets-ints.yaml": "model: tiny-gpt-neox\npeft: lora\nlora_targets: [1, 2]\n",
    "targets-empty.yaml": "model: tiny-gpt-neox\npeft: lora\nlora_targets: []\n",
    "cap-bool.yaml": "model: tiny-gpt-neox\nmemory_cap: true\n",
    "lora-r-no-peft.yaml": "model: tiny-gpt-neox\nlora_r: 64\n",
    "lora-r-peft-lora.yaml": "model: tiny-gpt-neox\npeft: lora\nlora_r: 64\n",
    "cap-bare.yaml": "model: tiny-gpt-neox\nmemory_cap: 12\n",
    "cap-bare-float.yaml": "model: tiny-gpt-neox\nmemory_cap: 12.5\n",
    "seq-neg.yaml": "model: tiny-gpt-neox\nseq_len: -5\n",
    "model-list.yaml": "model: [a, b]\n",
    "gpu-float.yaml": "model: tiny-gpt-neox\ngpu: 3.5\n",
    "rank-bool.yaml": "model: tiny-gpt-neox\nrank: true\n",
    "data-int.yaml": "model: tiny-gpt-neox\ndata: 12\n",
    # --training-args FILE.json
    "ta-null.json": '{"per_device_train_batch_size": null}',
    "ta-lr-text.json": '{"learning_rate": "fast"}',
    "ta-lr-nan.json": '{"learning_rate": NaN}',
    "ta-ckpt-no.json": '{"gradient_checkpointing": "no"}',
    "ta-list.json": "[1, 2]",
    "ta-unknown.json": '{"foo": 1}',
    "ta-broken.json": "{per_device",
    # --model config.json
    "number.json": "12",
    "string.json": '"hello"',
    "list.json": "[]",
    "no-type.json": "{}",
    "type-int.json": '{"model_type": 12}',
    "type-unknown.json": '{"model_type": "llama99"}',
    "t5.json": '{"model_type": "t5"}',
    "vit.json": '{"model_type": "vit"}',
    "bert.json": '{"model_type": "bert"}',
    "roberta.json": '{"model_type": "roberta"}',
    "llava.json": '{"model_type": "llava"}',
    "gemma3.json": json.dumps({"model_type": "gemma3", "text_config": {**LLAMA, "model_type": "gemma3_text",
                                                                       "head_dim": 16}}),
    "layers-neg.json": json.dumps({**LLAMA, "num_hidden_layers": -2}),
    "hidden-zero.json": json.dumps({**LLAMA, "hidden_size": 0}),
    "vocab-neg.json": json.dumps({**LLAMA, "vocab_size": -3}),
    "heads-zero.json": json.dumps({**LLAMA, "num_attention_heads": 0}),
    "mlp-zero.json": json.dumps({**LLAMA, "intermediate_size": 0}),
    "gpt2-layers-zero.json": json.dumps({"model_type": "gpt2", "n_layer": 0, "n_embd": 64, "n_head": 4}),
    "layers-text.json": json.dumps({**LLAMA, "num_hidden_layers": "two"}),
    "layers-float.json": json.dumps({**LLAMA, "num_hidden_layers": 2.5}),
    "eps-text.json": json.dumps({**LLAMA, "rms_norm_eps": "small"}),
    "kv-heads.json": json.dumps({**LLAMA, "num_key_value_heads": 3}),
    "act-unknown.json": json.dumps({**LLAMA, "hidden_act": "swish99"}),
    "pad-past-vocab.json": json.dumps({**LLAMA, "pad_token_id": 99999}),
    "dropout-inf.json": json.dumps({**LLAMA, "attention_dropout": float("inf")}),
    "broken.json": "{not json",
    # accepted
    "ckpt-true.yaml": "model: tiny-gpt-neox\ncheckpointing: true\n",
    "gpu-int.yaml": "model: tiny-gpt-neox\ngpu: 4090\n",
    "gpu-text.yaml": "model: tiny-gpt-neox\ngpu: \"4090\"\n",
    "typed-text.yaml": "model: tiny-gpt-neox\nbatch_size: \"2\"\nlr: 1e-4\ngpu: null\n",
    "nan-ok.json": json.dumps({**LLAMA, "rms_norm_eps": float("nan"), "not_a_field": float("inf")}),
    "bert-decoder.json": json.dumps({"model_type": "bert", "is_decoder": True, "hidden_size": 64,
                                     "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                                     "vocab_size": 1000}),
    "llama4.json": json.dumps({"model_type": "llama4", "text_config": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "intermediate_size_mlp": 128, "vocab_size": 1024, "max_position_embeddings": 512,
        "num_local_experts": 2}, "vision_config": {"hidden_size": 32, "num_hidden_layers": 1,
                                                   "num_attention_heads": 2, "intermediate_size": 64}}),
    # --data
    "data.csv": "a,b\n",
    # sweep --out
    "old-rows.jsonl": '{"kind": "estimate"}\n\n{"kind": "estimate"}\n',
    "empty-rows.jsonl": "",
    "locked.txt": "a line\n",
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Every file of FILES written to one folder (names with brackets among them), plus a folder and a file
    nobody may read; name -> path."""
    root = tmp_path_factory.mktemp("bad-inputs")
    out = {}
    for name, text in FILES.items():
        (root / name).write_text(text)
        out[name] = str(root / name)
    (root / "folder").mkdir()
    (root / "folder-no-config").mkdir()
    out["folder"], out["folder-no-config"] = str(root / "folder"), str(root / "folder-no-config")
    out["tv"] = __import__("transformers").__version__
    (root / "[red]x[").mkdir()  # a folder, so that the path holds a closing tag: .../[red]x[/red].yaml
    (root / "[red]x[" / "red].yaml").write_text("model: tiny-gpt-neox\nbatch_size: 4.7\n")
    out["bracketed.yaml"] = str(root / "[red]x[" / "red].yaml")
    (root / "m[").mkdir()
    (root / "m[" / "b].json").write_text(json.dumps(LLAMA))
    out["bracketed.json"] = str(root / "m[" / "b].json")  # .../m[/b].json: a closing tag with no opening one
    os.chmod(root / "locked.txt", 0)
    os.chmod(root / "ckpt-true.yaml", 0o644)
    locked_yaml = root / "locked.yaml"
    locked_yaml.write_text("batch_size: 2\n")
    os.chmod(locked_yaml, 0)
    out["locked.yaml"] = str(locked_yaml)
    return out


def cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    """`trainmem argv` in this process: exit status (argparse's SystemExit included), stdout, stderr."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def problem_lines(err: str, command: str) -> list[str]:
    """The problems a SetupError printed, checking its form: a header, then one line each, starting `- `."""
    lines = err.splitlines()
    assert lines[0] == f"trainmem {command}: the setup cannot run:", err
    assert lines[1:] and all(line.startswith("- ") for line in lines[1:]), err
    return [line[2:] for line in lines[1:]]


# (id, argv, the start of the problem line); every case exits 2. `{name}` is the path of FILES[name].
REFUSED = [
    # YAML fields: wrong type, null, unknown, unreadable
    ("yaml-model-int", ["estimate", "--config", "{model-int.yaml}", *FAST], "--model: unknown preset '12'"),
    ("yaml-null", ["estimate", "--config", "{null.yaml}", *FAST],
     "--config: batch_size in {null.yaml}: null, where a value is needed"),
    ("yaml-ckpt-no", ["estimate", "--config", "{ckpt-no.yaml}", *FAST],
     "--config: checkpointing in {ckpt-no.yaml}: expected true or false, got 'no'"),
    ("yaml-ckpt-yes-text", ["estimate", "--config", "{ckpt-yes-text.yaml}", *FAST],
     "--config: checkpointing in {ckpt-yes-text.yaml}: expected true or false, got 'yes'"),
    ("yaml-ckpt-one", ["estimate", "--config", "{ckpt-one.yaml}", *FAST],
     "--config: checkpointing in {ckpt-one.yaml}: expected true or false, got 1"),
    ("yaml-batch-float", ["estimate", "--config", "{batch-float.yaml}", *FAST],
     "--config: batch_size in {batch-float.yaml}: expected a whole number, got 4.7"),
    ("yaml-batch-bool", ["estimate", "--config", "{batch-bool.yaml}", *FAST],
     "--config: batch_size in {batch-bool.yaml}: expected a whole number, got true"),
    ("yaml-lr-inf", ["estimate", "--config", "{lr-inf.yaml}", *FAST],
     "--config: lr in {lr-inf.yaml}: expected a finite number, got inf"),
    ("yaml-lr-nan", ["estimate", "--config", "{lr-nan.yaml}", *FAST],
     "--config: lr in {lr-nan.yaml}: expected a finite number, got nan"),
    ("yaml-lr-text", ["estimate", "--config", "{lr-text.yaml}", *FAST],
     "--config: lr in {lr-text.yaml}: expected a finite number, got 'fast'"),
    ("yaml-dropout-list", ["estimate", "--config", "{dropout-list.yaml}", *FAST],
     "--config: lora_dropout in {dropout-list.yaml}: expected a finite number, got []"),
    ("yaml-peft-no", ["estimate", "--config", "{peft-no.yaml}", *FAST],
     "--config: peft in {peft-no.yaml}: expected text, got false (YAML reads yes/no/on/off as true/false"),
    ("yaml-peft-int", ["estimate", "--config", "{peft-int.yaml}", *FAST],
     "--config: peft in {peft-int.yaml}: expected text, got 3"),
    ("yaml-unknown-key", ["estimate", "--config", "{unknown-key.yaml}", *FAST],
     "--config: unknown field 'width' in {unknown-key.yaml}"),
    ("yaml-int-key", ["estimate", "--config", "{int-key.yaml}", *FAST], "--config: unknown field '1'"),
    ("yaml-list", ["estimate", "--config", "{list.yaml}", *FAST],
     "--config: cannot read '{list.yaml}': the top level must be a mapping of setup fields, not a list"),
    ("yaml-broken", ["estimate", "--config", "{broken.yaml}", *FAST], "--config: cannot read '{broken.yaml}'"),
    ("yaml-empty-no-model", ["estimate", "--config", "{empty.yaml}", *FAST], "--model: which model?"),
    ("yaml-targets-ints", ["estimate", "--config", "{targets-ints.yaml}", *FAST],
     "--config: lora_targets in {targets-ints.yaml}: expected a list of module names, got [1, 2]"),
    ("yaml-targets-empty", ["estimate", "--config", "{targets-empty.yaml}", *FAST],
     "--lora-targets: expected module names"),
    ("yaml-cap-bool", ["estimate", "--config", "{cap-bool.yaml}", *FAST],
     "--config: memory_cap in {cap-bool.yaml}: true is not a size"),
    ("yaml-lora-r-without-peft", ["estimate", "--config", "{lora-r-no-peft.yaml}", *FAST],
     "--config: lora_r in {lora-r-no-peft.yaml}: applies to --peft lora or qlora, and --peft is none; add --peft lora "
     "or drop lora_r from the file"),
    ("yaml-lora-r-flag-peft-none", ["estimate", "--config", "{lora-r-peft-lora.yaml}", "--peft", "none", *FAST],
     "--config: lora_r in {lora-r-peft-lora.yaml}: applies to --peft lora or qlora, and --peft is none"),
    ("yaml-cap-bare", ["estimate", "--config", "{cap-bare.yaml}", *FAST],
     "--config: memory_cap in {cap-bare.yaml}: 12 has no unit, and as bytes it is less than 1 MiB; write the unit, "
     "e.g. 12GiB"),
    ("yaml-cap-bare-float", ["estimate", "--config", "{cap-bare-float.yaml}", *FAST],
     "--config: memory_cap in {cap-bare-float.yaml}: 12.5 has no unit, and as bytes it is less than 1 MiB; write "
     "the unit, e.g. 12.5GiB"),
    ("yaml-seq-neg", ["estimate", "--config", "{seq-neg.yaml}", *FAST], "--seq-len: must be a whole number >= 1"),
    ("yaml-model-list", ["estimate", "--config", "{model-list.yaml}", *FAST],
     "--config: model in {model-list.yaml}: expected a name, got ['a', 'b']"),
    ("yaml-gpu-float", ["estimate", "--config", "{gpu-float.yaml}", *FAST],
     "--config: gpu in {gpu-float.yaml}: expected a name, got 3.5"),
    ("yaml-rank-bool", ["estimate", "--config", "{rank-bool.yaml}", *FAST],
     "--config: rank in {rank-bool.yaml}: expected a rank number or all, got true"),
    ("yaml-data-int", ["estimate", "--config", "{data-int.yaml}", *FAST],
     "--config: data in {data-int.yaml}: expected text, got 12"),
    ("yaml-folder", ["estimate", "--config", "{folder}", *FAST], "--config: cannot read '{folder}'"),
    ("yaml-missing", ["estimate", "--config", "{folder}/none.yaml", *FAST], "--config: cannot read"),
    ("yaml-empty-name", ["estimate", *TINY, "--config", "", *FAST], "--config: an empty file name"),
    ("yaml-bracketed-name", ["estimate", "--config", "{bracketed.yaml}", *FAST],
     "--config: batch_size in {bracketed.yaml}: expected a whole number, got 4.7"),
    # --training-args
    ("ta-null", ["estimate", *TINY, "--training-args", "{ta-null.json}", *FAST],
     "--training-args: per_device_train_batch_size in {ta-null.json}: expected a whole number, got null"),
    ("ta-lr-text", ["estimate", *TINY, "--training-args", "{ta-lr-text.json}", *FAST],
     "--training-args: learning_rate in {ta-lr-text.json}: expected a finite number, got 'fast'"),
    ("ta-lr-nan", ["estimate", *TINY, "--training-args", "{ta-lr-nan.json}", *FAST],
     "--training-args: learning_rate in {ta-lr-nan.json}: expected a finite number, got nan"),
    ("ta-ckpt-no", ["estimate", *TINY, "--training-args", "{ta-ckpt-no.json}", *FAST],
     "--training-args: gradient_checkpointing in {ta-ckpt-no.json}: expected true or false, got 'no'"),
    ("ta-list", ["estimate", *TINY, "--training-args", "{ta-list.json}", *FAST],
     "--training-args: cannot read '{ta-list.json}': the top level must be an object"),
    ("ta-unknown", ["estimate", *TINY, "--training-args", "{ta-unknown.json}", *FAST],
     "--training-args: unknown TrainingArguments field 'foo'"),
    ("ta-broken", ["estimate", *TINY, "--training-args", "{ta-broken.json}", *FAST], "--training-args: cannot read"),
    ("ta-folder", ["estimate", *TINY, "--training-args", "{folder}", *FAST], "--training-args: cannot read"),
    ("ta-empty-name", ["estimate", *TINY, "--training-args", "", *FAST], "--training-args: an empty file name"),
    # --model: config.json files that are no causal LM's
    ("config-number", ["estimate", "--model", "{number.json}", *FAST],
     "--model: {number.json} holds a number, not a JSON object"),
    ("config-string", ["estimate", "--model", "{string.json}", *FAST], "--model: {string.json} holds a string"),
    ("config-list", ["estimate", "--model", "{list.json}", *FAST], "--model: {list.json} holds a list"),
    ("config-no-type", ["estimate", "--model", "{no-type.json}", *FAST], "--model: '{no-type.json}' has no 'model_type'"),
    ("config-type-int", ["estimate", "--model", "{type-int.json}", *FAST],
     "--model: {type-int.json}: model_type 12 is unknown to the installed transformers"),
    ("config-type-unknown", ["estimate", "--model", "{type-unknown.json}", *FAST],
     "--model: {type-unknown.json}: model_type 'llama99' is unknown to the installed transformers"),
    ("config-t5", ["estimate", "--model", "{t5.json}", *FAST],
     "--model: {t5.json}: T5Config is not a causal language model (AutoModelForCausalLM has no class for it"),
    ("config-vit", ["estimate", "--model", "{vit.json}", *FAST], "--model: {vit.json}: ViTConfig is not a causal"),
    ("config-bert", ["estimate", "--model", "{bert.json}", *FAST],
     "--model: {bert.json}: BertConfig is an encoder; BertLMHeadModel trains it as a causal language model only "
     "with \"is_decoder\": true"),
    ("config-roberta", ["estimate", "--model", "{roberta.json}", *FAST], "--model: {roberta.json}: RobertaConfig is an encoder"),
    ("config-llava", ["estimate", "--model", "{llava.json}", *FAST],
     "--model: {llava.json}: LlavaConfig is not a causal language model (AutoModelForCausalLM has no class for it "
     "in transformers {tv}); its text model may be: save its text_config as a config.json with model_type "
     "'llama'"),
    ("config-gemma3", ["estimate", "--model", "{gemma3.json}", *FAST],
     "--model: {gemma3.json}: AutoModelForCausalLM builds Gemma3ForConditionalGeneration from Gemma3Config"),
    ("config-layers-neg", ["estimate", "--model", "{layers-neg.json}", *FAST],
     "--model: {layers-neg.json}: num_hidden_layers must be a whole number from 1 to 2**31 - 1, got -2"),
    ("config-hidden-zero", ["estimate", "--model", "{hidden-zero.json}", *FAST],
     "--model: {hidden-zero.json}: hidden_size must be a whole number from 1 to 2**31 - 1, got 0"),
    ("config-vocab-neg", ["estimate", "--model", "{vocab-neg.json}", *FAST],
     "--model: {vocab-neg.json}: vocab_size must be a whole number from 1 to 2**31 - 1, got -3"),
    ("config-heads-zero", ["estimate", "--model", "{heads-zero.json}", *FAST],
     "--model: {heads-zero.json}: num_attention_heads must be a whole number from 1 to 2**31 - 1, got 0"),
    ("config-mlp-zero", ["estimate", "--model", "{mlp-zero.json}", *FAST],
     "--model: {mlp-zero.json}: intermediate_size must be"),
    ("config-gpt2-layers", ["estimate", "--model", "{gpt2-layers-zero.json}", *FAST],
     "--model: {gpt2-layers-zero.json}: n_layer must be a whole number from 1 to 2**31 - 1, got 0"),
    ("config-layers-text", ["estimate", "--model", "{layers-text.json}", *FAST],
     "--model: {layers-text.json}: num_hidden_layers must be a whole number from 1 to 2**31 - 1, got 'two'"),
    ("config-layers-float", ["estimate", "--model", "{layers-float.json}", *FAST],
     "--model: {layers-float.json}: num_hidden_layers must be a whole number from 1 to 2**31 - 1, got 2.5"),
    ("config-eps-text", ["estimate", "--model", "{eps-text.json}", *FAST],
     "--model: {eps-text.json}: transformers {tv} refuses it as a LlamaConfig: "),
    ("config-kv-heads", ["estimate", "--model", "{kv-heads.json}", *FAST],
     "--model: {kv-heads.json}: num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
    ("config-act-unknown", ["estimate", "--model", "{act-unknown.json}", *FAST],
     "--model: {act-unknown.json}: transformers {tv} cannot build the model from this config: KeyError: 'swish99'"),
    ("config-pad-past-vocab", ["estimate", "--model", "{pad-past-vocab.json}", *FAST],
     "--model: {pad-past-vocab.json}: transformers {tv} cannot build the model from this config: AssertionError"),
    ("config-dropout-inf", ["estimate", "--model", "{dropout-inf.json}", *FAST],
     "--model: {dropout-inf.json}: attention_dropout must be a probability in [0, 1], got inf"),
    ("config-broken", ["estimate", "--model", "{broken.json}", *FAST], "--model: cannot read config '{broken.json}'"),
    ("config-folder-without", ["estimate", "--model", "{folder-no-config}", *FAST], "--model: cannot read config"),
    ("model-empty", ["estimate", "--model", "", *FAST], "--model: an empty name"),
    ("model-missing", ["estimate", *FAST], "--model: which model? a preset"),
    ("model-bracketed", ["estimate", "--model", "[red]x[/red]", *FAST], "--model: '[red]x[/red]' is neither"),
    ("model-bad-tag", ["estimate", "--model", "foo[/x]", *FAST], "--model: 'foo[/x]' is neither"),
    # flags: wrong type, zero, negative, huge, nan/inf, empty, unknown choice, paths
    ("lr-nan", ["estimate", *TINY, "--lr", "nan", *FAST], "--lr: expected a finite number, got 'nan'"),
    ("lr-inf", ["estimate", *TINY, "--lr", "inf", *FAST], "--lr: expected a finite number, got 'inf'"),
    ("lr-zero", ["estimate", *TINY, "--lr", "0", *FAST], "--lr: must be a finite number > 0, got 0.0"),
    ("lr-negative", ["estimate", *TINY, "--lr=-1e-4", *FAST], "--lr: must be a finite number > 0"),
    ("lora-r-above-layers", ["estimate", *TINY, "--peft", "lora", "--lora-r", "100000", *FAST],
     "--lora-r: 100000 is more than the smallest dimension of the layers it adapts (64: "
     "gpt_neox.layers.0.attention.query_key_value is 192 x 64)"),
    ("lora-r-huge", ["estimate", *TINY, "--peft", "lora", "--lora-r", "9" * 20, *FAST],
     f"--lora-r: {'9' * 20} is out of range; at most 2147483647"),
    ("lora-r-zero", ["estimate", *TINY, "--peft", "lora", "--lora-r", "0", *FAST], "--lora-r: must be a whole number >= 1"),
    ("lora-alpha-zero", ["estimate", *TINY, "--peft", "lora", "--lora-alpha", "0", *FAST], "--lora-alpha: must be"),
    ("lora-dropout-inf", ["estimate", *TINY, "--peft", "lora", "--lora-dropout", "inf", *FAST],
     "--lora-dropout: expected a finite number, got 'inf'"),
    ("lora-dropout-one", ["estimate", *TINY, "--peft", "lora", "--lora-dropout", "1", *FAST],
     "--lora-dropout: must be in [0, 1), got 1.0"),
    ("lora-r-without-peft", ["estimate", *TINY, "--lora-r", "64", *FAST],
     "--lora-r: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop --lora-r"),
    ("lora-alpha-peft-none", ["estimate", *TINY, "--peft", "none", "--lora-alpha", "16", *FAST],
     "--lora-alpha: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop --lora-alpha"),
    ("lora-dropout-without-peft", ["run", *TINY, "--lora-dropout", "0", "--device", "cpu", "--no-isolate"],
     "--lora-dropout: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop --lora-dropout"),
    ("lora-targets-without-peft", ["estimate", *TINY, "--lora-targets", "query_key_value", *FAST],
     "--lora-targets: applies to --peft lora or qlora, and --peft is none; add --peft lora or drop --lora-targets"),
    ("maxbatch-lora-r-without-peft", ["max-batch", *TINY, "--gpu", "T4", "--lora-r", "64"], "--lora-r: applies to"),
    ("plan-lora-r-peft-not-searched", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--allow", "checkpointing",
                                       "--lora-r", "16"], "--lora-r: applies to --peft lora or qlora"),
    ("lora-targets-empty", ["estimate", *TINY, "--peft", "lora", "--lora-targets", "", *FAST],
     "--lora-targets: expected module names"),
    ("lora-targets-unknown", ["estimate", *TINY, "--peft", "lora", "--lora-targets", "q_proj", *FAST],
     "--lora-targets: tiny-gpt-neox has no adaptable module named 'q_proj'"),
    ("batch-huge", ["estimate", *TINY, "--batch-size", "9" * 20, *FAST], "--batch-size: " + "9" * 20 + " is out of range"),
    ("batch-float", ["estimate", *TINY, "--batch-size", "4.7", *FAST], "--batch-size: expected a whole number, got '4.7'"),
    ("batch-empty", ["estimate", *TINY, "--batch-size", "", *FAST], "--batch-size: expected a whole number, got ''"),
    ("batch-bracketed", ["estimate", *TINY, "--batch-size", "[b]4", *FAST], "--batch-size: expected a whole number, got '[b]4'"),
    ("seq-zero", ["estimate", *TINY, "--seq-len", "0", *FAST], "--seq-len: must be a whole number >= 1, got 0"),
    ("seq-past-positions", ["estimate", *TINY, "--seq-len", "4096", *FAST], "--seq-len: 4096 is longer than tiny-gpt-neox's"),
    ("gpus-huge", ["estimate", *TINY, "--gpus", "9" * 20, "--shard", "fsdp", *FAST], "--gpus: " + "9" * 20 + " is out of range"),
    ("shard-without-gpus", ["estimate", *TINY, "--shard", "fsdp", *FAST],
     "--shard fsdp: needs --gpus N with N >= 2 (one GPU has nothing to spread states over); add --gpus 2 or more, "
     "or drop --shard"),
    ("shard-one-gpu", ["run", *TINY, "--gpus", "1", "--shard", "ddp", "--device", "cpu", "--no-isolate"],
     "--shard ddp: needs --gpus N with N >= 2"),
    ("gpus-without-shard", ["estimate", *TINY, "--gpus", "2", *FAST], "--gpus 2: say how states are spread"),
    ("seed-huge", ["run", *TINY, "--seed", "9" * 30, "--device", "cpu", "--no-isolate"],
     "--seed: must be a whole number torch can seed with"),
    ("cap-zero", ["estimate", *TINY, "--memory-cap", "0GiB", *FAST], "--memory-cap: must be a positive number of bytes"),
    ("cap-bare", ["estimate", *TINY, "--memory-cap", "12", *FAST],
     "--memory-cap: 12 has no unit, and as bytes it is less than 1 MiB; write the unit, e.g. 12GiB"),
    ("cap-bare-mib", ["run", *TINY, "--memory-cap", "16000", "--device", "cpu", "--no-isolate"],
     "--memory-cap: 16000 has no unit, and as bytes it is less than 1 MiB; write the unit, e.g. 16000MiB"),
    ("cap-bare-zero", ["estimate", *TINY, "--memory-cap", "0", *FAST], "--memory-cap: 0 has no unit"),
    ("cap-nan", ["estimate", *TINY, "--memory-cap", "nanGiB", *FAST], "--memory-cap: 'nanGiB' is not a size"),
    ("cap-dots", ["estimate", *TINY, "--memory-cap", "1.2.3GiB", *FAST], "--memory-cap: '1.2.3GiB' is not a size"),
    ("cap-negative", ["estimate", *TINY, "--memory-cap=-5GiB", *FAST], "--memory-cap: '-5GiB' is not a size"),
    ("cap-unit", ["estimate", *TINY, "--memory-cap", "12 parsecs", *FAST], "--memory-cap: '12 parsecs' is not a size"),
    ("margin-nan", ["estimate", *TINY, "--margin", "nan", *FAST], "--margin: expected a fraction in [0, 1), got 'nan'"),
    ("margin-inf", ["estimate", *TINY, "--margin", "inf", *FAST], "--margin: expected a fraction in [0, 1)"),
    ("margin-one", ["estimate", *TINY, "--margin", "1", *FAST], "--margin: expected a fraction in [0, 1)"),
    ("gpu-empty", ["estimate", *TINY, "--gpu", "", *FAST], "--gpu: unknown card ''"),
    ("gpu-bracketed", ["estimate", *TINY, "--gpu", "[bold]T4", *FAST], "--gpu: unknown card '[bold]T4'"),
    ("gpu-ambiguous", ["estimate", *TINY, "--gpu", "A100", *FAST], "--gpu: 'A100' comes with different memory sizes"),
    ("gpu-near-miss", ["estimate", *TINY, "--gpu", "3090ti", *FAST],
     "--gpu: unknown card '3090ti'; did you mean RTX-3090? (or cap by bytes with --memory-cap)"),
    ("peft-unknown", ["estimate", *TINY, "--peft", "adapter", *FAST], "--peft: 'adapter' is not one of none, lora, qlora"),
    ("precision-unknown", ["estimate", *TINY, "--precision", "fp8", *FAST], "--precision: 'fp8' is not one of"),
    ("optimizer-unknown", ["estimate", *TINY, "--optimizer", "lion", *FAST], "--optimizer: 'lion' is not one of"),
    ("attention-unknown", ["estimate", *TINY, "--attention", "flash", *FAST], "--attention: 'flash' is not one of"),
    ("shard-unknown", ["estimate", *TINY, "--shard", "zero9", *FAST], "--shard: 'zero9' is not one of"),
    ("kernels-unknown", ["estimate", *TINY, "--kernels", "ligr", *FAST],
     "--kernels: 'ligr' is not one of none, liger; did you mean liger?"),
    ("kernels-family", ["estimate", *TINY, "--kernels", "liger"],
     "--kernels liger: trainmem models Liger's kernels for llama, mistral, qwen2, qwen3 models, and tiny-gpt-neox is "
     "gpt_neox; use --kernels none"),
    ("kernels-analytic", ["estimate", "--model", "tiny-llama", "--kernels", "liger", *FAST],
     "--method analytic: does not model --kernels liger"),
    ("mamba-path-unknown", ["estimate", "--model", "tiny-granitemoehybrid", "--mamba-path", "kernel", *FAST],
     "--mamba-path: 'kernel' is not one of torch, kernels; did you mean kernels?"),
    ("mamba-path-no-mixer", ["estimate", *TINY, "--mamba-path", "kernels"],
     "--mamba-path kernels: tiny-gpt-neox (gpt_neox) has no Mamba mixer for it to change; drop --mamba-path"),
    ("mamba-path-analytic", ["estimate", "--model", "tiny-granitemoehybrid", "--mamba-path", "kernels", *FAST],
     "--method analytic: does not model --mamba-path kernels"),
    ("mamba-path-run-here", ["run", "--model", "tiny-granitemoehybrid", "--mamba-path", "kernels", "--device", "cpu",
                             "--no-isolate"], "--mamba-path kernels: cannot run here"),
    ("kernels-cpu", ["run", "--model", "tiny-llama", "--kernels", "liger", "--device", "cpu", "--no-isolate"],
     "--kernels liger: Liger's kernels are Triton kernels, which run on CUDA only"),
    ("offload-without-shard", ["estimate", *TINY, "--offload", "params", "--shard", "zero2", *FAST],
     "--offload params: only ZeRO-3 and FSDP"),
    ("rank-out-of-range", ["run", *TINY, "--rank", "5", "--gpus", "2", "--shard", "fsdp", "--device", "cpu"],
     "--rank 5: out of range for --gpus 2"),
    ("rank-text", ["run", *TINY, "--rank", "x", "--gpus", "2", "--shard", "fsdp", "--device", "cpu"],
     "--rank x: out of range"),
    # a flag the command does not use
    ("estimate-sft-analytic", ["estimate", *TINY, "--engine", "sft", "--method", "analytic"],
     "--method analytic: does not model --engine sft (TRL's fused LM head is priced by simulating the step); use "
     "--method simulate or auto"),
    ("estimate-rank", ["estimate", *TINY, "--rank", "1", "--gpus", "2", "--shard", "fsdp", *FAST],
     "--rank: trainmem estimate does not use it (it predicts rank 0 of --shard fsdp and the fullest rank of --shard "
     "zero1|zero2; --rank picks the rank trainmem run measures); drop it"),
    ("estimate-steps", ["estimate", *TINY, "--steps", "10", *FAST], "--steps: trainmem estimate does not use it"),
    ("estimate-num-samples", ["estimate", *TINY, "--num-samples", "8", *FAST],
     "--num-samples: trainmem estimate does not use it"),
    ("maxbatch-batch-size", ["max-batch", *TINY, "--gpu", "T4", "--batch-size", "8"],
     "--batch-size: trainmem max-batch does not use it (it searches the micro-batch; --target-batch N adds the "
     "accumulation for an effective batch); drop it"),
    ("maxbatch-memory-cap", ["max-batch", *TINY, "--gpu", "T4", "--memory-cap", "8GiB"],
     "--memory-cap: trainmem max-batch does not use it (it fits the --gpu card, less --margin); drop it"),
    ("plan-steps", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--steps", "5"],
     "--steps: trainmem plan does not use it (it estimates the steady step, and --confirm runs 8 steps); drop it"),
    ("plan-memory-cap", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--memory-cap", "8GiB"],
     "--memory-cap: trainmem plan does not use it"),
    ("verify-batch-size", ["verify-accumulation", "--batch-size", "4"],
     "--batch-size: trainmem verify-accumulation does not use it (--full-batch and --micro-batch set its batches); "
     "drop it"),
    ("verify-precision", ["verify-accumulation", "--precision", "bf16"],
     "--precision: trainmem verify-accumulation does not use it (--dtype sets the weights' dtype); drop it"),
    ("verify-optimizer", ["verify-accumulation", "--optimizer", "sgd"],
     "--optimizer: trainmem verify-accumulation does not use it (it compares gradients and takes no optimizer step)"),
    ("verify-gpus", ["verify-accumulation", "--gpus", "2", "--shard", "ddp"], "--gpus: trainmem verify-accumulation "
     "does not use it (it compares one process's gradients); drop it"),
    ("sweep-empty-item", ["sweep", *TINY, "--batch-size", "2,,4", "--out", "{folder}/x.jsonl"],
     "--batch-size: '2,,4' has an empty item (item 2 of 3); put one value between commas, e.g. 2,4"),
    ("sweep-empty-value", ["sweep", *TINY, "--batch-size", "", "--out", "{folder}/x.jsonl"],
     "point 1 (model=tiny-gpt-neox, batch_size=): --batch-size: expected a whole number, got ''"),
    ("lora-targets-empty-item", ["estimate", *TINY, "--peft", "lora", "--lora-targets", "query_key_value,,dense", *FAST],
     "--lora-targets: 'query_key_value,,dense' has an empty item; put one module name between commas, e.g. "
     "query_key_value,dense"),
    ("sweep-out-not-empty", ["sweep", *TINY, "--method", "estimate", "--out", "{old-rows.jsonl}"],
     "--out: {old-rows.jsonl} already holds 2 lines; a sweep without --resume would append its points again: add "
     "--resume to skip the points it holds, or pass a new --out"),
    ("lr-batch-zero", ["estimate", *TINY, "--lr-batch", "0", *FAST], "--lr-batch: must be a whole number >= 1"),
    ("method-unknown", ["estimate", *TINY, "--method", "guess"], "--method: 'guess' is not one of"),
    ("data-folder", ["estimate", *TINY, "--data", "{folder}", *FAST], "--data: '{folder}' is a folder"),
    ("data-missing", ["estimate", *TINY, "--data", "{folder}/none.txt", *FAST], "--data: no such file"),
    ("data-csv", ["estimate", *TINY, "--data", "{data.csv}", *FAST], "--data: '{data.csv}' must be a .txt"),
    ("data-empty-name", ["estimate", *TINY, "--data", "", *FAST], "--data: expected a file name, got ''"),
    # plan's and max-batch's own numbers
    ("plan-epochs-nan", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--epochs", "nan", "--dataset-size", "9"],
     "--epochs: expected a number from 0.001 to 1e+06, got 'nan'"),
    ("plan-epochs-inf", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--epochs", "inf", "--dataset-size", "9"],
     "--epochs: expected a number"),
    ("plan-tokens-huge", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--tokens", "9" * 400], "--tokens: expected a whole number"),
    ("plan-margin-nan", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--margin", "nan"], "--margin: expected a fraction"),
    ("plan-target-zero", ["plan", *TINY, "--gpu", "T4", "--target-batch", "0"], "--target-batch: expected a whole number"),
    ("plan-top-text", ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--top", "x"], "--top: expected a whole number"),
    ("plan-preset-unknown", ["plan", "--preset", "book", "--gpu", "T4"], "--preset: 'book' is not one of chapter"),
    ("plan-config-without-model", ["plan", "--config", "{empty.yaml}", "--gpu", "T4", "--target-batch", "4"],
     "--model: which model? a preset"),
    ("maxbatch-target-nan", ["max-batch", *TINY, "--gpu", "T4", "--target-batch", "nan"], "--target-batch: expected a whole number"),
    ("maxbatch-margin-inf", ["max-batch", *TINY, "--gpu", "T4", "--margin", "inf"], "--margin: expected a fraction"),
    ("verify-full-batch-negative", ["verify-accumulation", "--full-batch", "-1"], "--full-batch: must be a whole number >= 1"),
    ("verify-micro-batch-zero", ["verify-accumulation", "--micro-batch", "0"], "--micro-batch: must be a whole number >= 1"),
    ("run-lr-inf", ["run", *TINY, "--lr", "inf", "--device", "cpu", "--no-isolate"], "--lr: expected a finite number"),
    ("run-launch-one-gpu", ["run", *TINY, "--device", "cpu", "--launch"], "--launch: runs N ranks as N processes; "
     "needs --gpus N (N >= 2) and --shard fsdp|ddp (got --gpus 1 --shard none)"),
    ("run-launch-rank", ["run", *TINY, "--device", "cpu", "--gpus", "2", "--shard", "fsdp", "--rank", "0", "--launch"],
     "--rank 0: --launch runs every rank; drop --rank"),
    ("run-print-only-alone", ["run", *TINY, "--device", "cpu", "--print-only"], "--print-only: prints the command of "
     "--launch; add --launch"),
    ("run-ckpt-no", ["run", "--config", "{ckpt-no.yaml}", "--device", "cpu", "--no-isolate"],
     "--config: checkpointing in {ckpt-no.yaml}: expected true or false"),
    ("report-missing", ["report", "{folder}/none.jsonl"], "FILE.jsonl: no such file"),
]


def _filled(text: str, paths: dict[str, str]) -> str:
    return re.sub(r"\{([^{}]+)\}", lambda m: paths.get(m.group(1), m.group(0)), text)


@pytest.mark.parametrize("argv,needle", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_with_one_line_naming_the_flag_field_or_file(capsys, paths, argv, needle):
    argv = [_filled(a, paths) for a in argv]
    code, out, err = cli(capsys, argv)
    assert code == 2 and out == "", err
    found = problem_lines(err, argv[0])
    assert any(p.startswith(_filled(needle, paths)) for p in found), found


def test_the_corpus_is_large_and_every_id_is_unique():
    assert len(REFUSED) >= 60 and len({c[0] for c in REFUSED}) == len(REFUSED)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_files(capsys, paths):
    code, _, err = cli(capsys, ["estimate", *TINY, "--data", paths["locked.txt"], *FAST])
    assert code == 2 and f"--data: {paths['locked.txt']!r} cannot be read (permission denied)" in problem_lines(err, "estimate")
    code, _, err = cli(capsys, ["estimate", *TINY, "--config", paths["locked.yaml"], *FAST])
    assert code == 2 and problem_lines(err, "estimate")[0].startswith(f"--config: cannot read {paths['locked.yaml']!r}")


def test_all_problems_at_once(capsys, paths):
    code, _, err = cli(capsys, ["estimate", "--config", paths["batch-float.yaml"], "--lr", "inf", "--gpu", "T5",
                                "--peft", "adapter", "--margin", "2", *FAST])
    found = problem_lines(err, "estimate")
    assert code == 2 and len(found) == 5, found


def test_argparse_errors_name_the_flag(capsys):
    for argv, needle in ((["verify-accumulation", "--full-batch", "x"], "argument --full-batch: invalid int value"),
                         (["estimate", "--bogus"], "unrecognized arguments: --bogus"), ([], "required: command"),
                         (["nonsense"], "invalid choice: 'nonsense'")):
        code, _, err = cli(capsys, argv)
        assert code == 2 and needle in err


def test_a_misspelt_flag_is_told_the_closest_one(capsys):
    code, _, err = cli(capsys, ["estimate", "--model", "gpt2", "--offlaod", "optimizer", "--bacth-size=2"])
    assert code == 2
    assert "--offlaod: did you mean --offload?" in err and "--bacth-size: did you mean --batch-size?" in err
    for far in ("--zzzz", "--bogus"):  # nothing near: no suggestion (not --gpus for --bogus)
        code, _, err = cli(capsys, ["estimate", far])
        assert code == 2 and f"unrecognized arguments: {far}" in err and "did you mean" not in err


# --- the net in main: the unexpected is one line, Ctrl-C is "interrupted" ---------------------------------
def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    import trainmem.estimator

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(trainmem.estimator, "estimate", broken)
    monkeypatch.delenv("TRAINMEM_DEBUG", raising=False)
    code, out, err = cli(capsys, ["estimate", *TINY, *FAST])
    assert code == 1 and out == ""
    assert err.splitlines() == ["trainmem estimate: internal error: RuntimeError: boom second line",
                                "set TRAINMEM_DEBUG=1 for the traceback"]
    monkeypatch.setenv("TRAINMEM_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["estimate", *TINY, *FAST])


def test_keyboard_interrupt_in_process(capsys, monkeypatch):
    import trainmem.estimator

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainmem.estimator, "estimate", interrupted)
    code, _, err = cli(capsys, ["estimate", *TINY, *FAST])
    assert code == 130 and err.strip() == "trainmem estimate: interrupted"


def test_ctrl_c_of_a_running_estimate_exits_130_without_a_traceback():
    """SIGINT to a process in the middle of a slow estimate (a 1B model simulated). It is sent once the process
    has imported trainmem and entered `main`: Ctrl-C during Python's own imports is Python's. The child gets the
    default SIGINT disposition a terminal's foreground process has: a test run as a background job (`cmd &`)
    hands its children SIGINT ignored, which trainmem rightly keeps ignored."""
    code = ("import signal, sys, trainmem.cli; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "print('ready', flush=True); sys.exit(trainmem.cli.main(['estimate', "
            "'--model', 'llama-3.2-1b', '--method', 'simulate', '--gpu', 'A100-40GB']))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert "Traceback" not in err
    assert p.returncode == 130 and err.strip().endswith("trainmem estimate: interrupted"), err


# --- accepted, and read right ---------------------------------------------------------------------------
def estimate_json(capsys, argv: list[str]) -> dict:
    code, out, err = cli(capsys, ["estimate", *argv, "--json"])
    assert code == 0, err
    assert "NaN" not in out and "Infinity" not in out
    return json.loads(out)


def test_yaml_values_that_are_right(capsys, paths):
    row = estimate_json(capsys, ["--config", paths["ckpt-true.yaml"], *FAST])
    plain = estimate_json(capsys, [*TINY, *FAST])
    assert row["setup"]["checkpointing"] is True and row["memory"]["activations"] < plain["memory"]["activations"]
    for name in ("gpu-int.yaml", "gpu-text.yaml"):  # YAML reads gpu: 4090 as a number; the card is meant
        row = estimate_json(capsys, ["--config", paths[name], *FAST])
        assert row["setup"]["gpu"] == "4090" and row["verdict"]["gpu"] == "RTX-4090"
    row = estimate_json(capsys, ["--config", paths["typed-text.yaml"], *FAST])
    assert (row["setup"]["batch_size"], row["setup"]["lr"], row["setup"]["gpu"]) == (2, 1e-4, None)


def test_model_configs_that_are_right(capsys, paths):
    row = estimate_json(capsys, ["--model", paths["nan-ok.json"], *FAST, "--seq-len", "32"])
    assert row["model"]["model_type"] == "llama"  # NaN and Infinity that transformers loads pass
    row = estimate_json(capsys, ["--model", paths["bert-decoder.json"], *FAST, "--seq-len", "32"])
    assert row["model"]["model_type"] == "bert"  # an encoder configured as a decoder is a causal LM
    row = estimate_json(capsys, ["--model", paths["llama4.json"], *FAST, "--seq-len", "32"])
    assert row["model"]["model_type"] == "llama4_text"  # read through its text config, as from_config does


def test_json_never_holds_nan_or_infinity():
    from trainmem.output.render import json_line

    line = json_line({"losses": [1.5, float("nan"), float("inf")], "notes": [], "time": {"mfu": float("-inf")}})
    row = json.loads(line)
    assert row["losses"] == [1.5, None, None] and row["time"]["mfu"] is None
    assert "losses, time.mfu" in row["notes"][0] and "NaN" not in line.replace("(NaN or inf", "")


# --- the answer first -----------------------------------------------------------------------------------
def test_the_first_line_is_the_verdict(capsys):
    code, out, _ = cli(capsys, ["estimate", "--model", "polyglot-ko-1.3b", "--precision", "fp16", "--batch-size",
                                "16", "--gpu", "T4", *FAST])
    first = out.splitlines()[0]
    assert code == 0 and first.startswith("does not fit T4: needs ") and " GiB of 14.8 (peak reserved + memory " \
        "outside the allocator); cut first: activations: add --checkpointing" in first
    code, out, _ = cli(capsys, ["estimate", *TINY, "--gpu", "T4", *FAST])
    first = out.splitlines()[0]
    assert re.fullmatch(r"fits T4: needs \d+\.\d GiB of 14\.8, \d+\.\d GiB free beyond the 2% margin", first), first
    assert "cut first" not in out
    code, out, _ = cli(capsys, ["estimate", *TINY, *FAST])
    assert out.splitlines()[0].startswith("peak ") and "pass --gpu NAME" in out.splitlines()[0]


def test_memory_cap_gives_a_verdict(capsys):
    row = estimate_json(capsys, [*TINY, "--memory-cap", "12GiB", *FAST])
    assert row["verdict"]["gpu"] == "12.0 GiB cap" and row["verdict"]["capacity"] == 12 * 2**30
    assert row["verdict"]["runtime"] == "H200"
    row = estimate_json(capsys, [*TINY, "--memory-cap", "8GiB", "--gpu", "T4", *FAST])
    assert row["verdict"]["gpu"] == "8.0 GiB cap" and row["verdict"]["runtime"] == "T4"
    row = estimate_json(capsys, [*TINY, "--memory-cap", "100GiB", "--gpu", "T4", *FAST])
    assert row["verdict"]["gpu"] == "T4"
    code, out, _ = cli(capsys, ["estimate", *TINY, "--memory-cap", "1MiB", *FAST])
    assert out.startswith("does not fit the 1 MiB cap (with the H200's runtime figures): needs")
    # the forms --help gives, and a bare number of bytes (as a row records the cap)
    for text, size in (("12.5GiB", int(12.5 * 2**30)), ("12000MiB", 12000 * 2**20), ("12GB", 12 * 10**9),
                       ("12gib", 12 * 2**30), (str(12 * 2**30), 12 * 2**30)):
        assert estimate_json(capsys, [*TINY, "--memory-cap", text, *FAST])["verdict"]["capacity"] == size, text


def test_memory_cap_in_a_file_takes_the_same_forms(capsys, tmp_path):
    for value, size in (('"12GiB"', 12 * 2**30), ("12.5GiB", int(12.5 * 2**30)), (str(12 * 2**30), 12 * 2**30)):
        path = tmp_path / "cap.yaml"
        path.write_text(f"model: tiny-gpt-neox\nmemory_cap: {value}\n")
        row = estimate_json(capsys, ["--config", str(path), *FAST])
        assert row["setup"]["memory_cap"] == row["verdict"]["capacity"] == size, value


def test_repeated_notes_are_hidden_unless_verbose(capsys):
    argv = ["estimate", *TINY, "--gpu", "RTX-4090", *FAST]
    _, out, _ = cli(capsys, argv)
    assert "runtime figures derived from the H200" not in out and "datasheet figures with" not in out
    hidden = re.search(r"\((\d+) notes? hidden; --verbose\)", out)
    assert hidden and int(hidden.group(1)) >= 2
    _, loud, _ = cli(capsys, [*argv, "--verbose"])
    assert "note: RTX-4090: runtime figures derived from the H200" in loud and "hidden; --verbose" not in loud


def test_third_party_warnings_are_filtered_unless_verbose(capsys, monkeypatch):
    import logging
    import warnings

    import trainmem.estimator

    real, heard = trainmem.estimator.estimate, []

    def noisy(*args, **kwargs):
        warnings.warn("a torch UserWarning", UserWarning, stacklevel=1)
        heard.append(logging.getLogger("transformers.modeling_utils").isEnabledFor(logging.WARNING))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainmem.estimator, "estimate", noisy)
    for verbose in (False, True):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            code, _, err = cli(capsys, ["estimate", *TINY, *FAST] + (["--verbose"] if verbose else []))
        assert code == 0 and "UserWarning" not in err
        assert any("a torch UserWarning" in str(w.message) for w in seen) is verbose
    assert heard == [False, True]


def test_version(capsys):
    import torch
    import transformers

    import trainmem

    code, out, _ = cli(capsys, ["--version"])
    assert code == 0
    assert out.strip() == f"trainmem {trainmem.__version__} (torch {torch.__version__}, transformers {transformers.__version__})"


def test_help_speaks_of_no_seed_or_chapter_but_the_preset_that_defines_it(capsys):
    for command in ("run", "estimate", "plan", "max-batch", "verify-accumulation", "sweep"):
        _, out, _ = cli(capsys, [command, "--help"])
        text = " ".join(out.split()).replace("random seed", "").replace("learning rate, seed,", "")
        text = text.replace("--seed X", "").replace("[--seed X]", "")
        found = re.findall(r"[^.;]*\b(?:seed|chapter)\b[^.;]*", text)
        assert all("--preset" in f and "the tutorial chapter trainmem grew from" in f for f in found), (command, found)
    _, out, _ = cli(capsys, ["--help"])
    assert not re.search(r"\b(?:seed|chapter)\b", out)


def test_markup_in_user_text_is_printed_as_it_is(capsys, paths, monkeypatch, tmp_path):
    _, _, err = cli(capsys, ["estimate", "--config", paths["bracketed.yaml"], *FAST])
    assert "[red]x[/red].yaml" in err
    import trainmem.measure.build

    monkeypatch.setattr(trainmem.measure.build, "has_bitsandbytes", lambda: False)
    code, _, err = cli(capsys, ["run", *TINY, "--optimizer", "adamw-8bit", "--device", "cpu", "--no-isolate"])
    assert code == 2 and "(pip install 'trainmem[qlora]' on a CUDA machine)" in err
    from trainmem.output.report import plots

    monkeypatch.setattr(plots, "available", lambda: False)
    sample = os.path.join(os.path.dirname(__file__), "..", "data", "chapter-sample.jsonl")
    code, out, _ = cli(capsys, ["report", sample, "--out", str(tmp_path)])
    assert code == 0 and "pip install 'trainmem[report]'" in out


def test_run_says_whether_it_fit_the_card_or_the_cap_first(capsys):
    run = ["run", *TINY, "--device", "cpu", "--no-isolate", "--steps", "1", "--seq-len", "8", "--batch-size", "1",
           "--num-samples", "1"]
    _, out, _ = cli(capsys, [*run, "--gpu", "T4"])
    assert re.match(r"fits T4: ran 1 step under its cap and needs \d+\.\d GiB of 14\.8 .*free beyond the 2% margin", out)
    code, out, _ = cli(capsys, [*run, "--gpu", "T4", "--memory-cap", "2MiB"])
    assert code == 0 and out.startswith("does not fit the 2 MiB cap: out of memory in step1.")
    _, out, _ = cli(capsys, run)
    assert out.startswith("ran: 1/1 steps on the cpu")


def test_a_model_path_with_markup_in_it_is_printed_as_it_is(capsys, paths, tmp_path):
    model = ["--model", paths["bracketed.json"], "--seq-len", "32", "--gpu", "T4"]
    for argv in (["estimate", *model, *FAST], ["max-batch", *model],
                 ["plan", *model, "--target-batch", "4", "--allow", "none", "--finalists", "0"],
                 ["run", *model, "--device", "cpu", "--steps", "1", "--batch-size", "1", "--num-samples", "1",
                  "--no-isolate"]):
        code, out, err = cli(capsys, argv)
        assert code == 0 and "m[/b].json" in out.replace("\n", ""), (argv[0], err)
    code, _, err = cli(capsys, ["sweep", "--model", paths["bracketed.json"], "--seq-len", "32", "--batch-size", "1,2",
                                "--method", "estimate", "--estimator", "analytic", "--out", str(tmp_path / "rows.jsonl")])
    assert code == 0 and "m[/b].json b2 none estimate: ok" in " ".join(err.split()), err  # long paths wrap


# --- a table of mistypes for every field, in a file and as a flag ----------------------------------------
MISTYPED = [None, True, 0, -1, 2.5, float("nan"), float("inf"), "", "[red]x[/red]", [], {"a": 1}, 10**30]
MISTYPED_TEXT = ["x", "", "-1", "0", "nan", "inf", "9" * 20, "[red]x[/red]", "1.5", "/"]


def _named(problems: list[str], field: str) -> bool:
    flag = "--" + field.replace("_", "-")
    return any(p.startswith((flag + ":", flag + " ", f"--config: {field} in ")) for p in problems)


@pytest.mark.parametrize("field", [f.name for f in __import__("dataclasses").fields(
    __import__("trainmem").TrainSetup)], ids=lambda f: f"{f}-field")  # not bare `gpu`: conftest's GPU marker
def test_every_yaml_field_mistyped(capsys, tmp_path, field):
    """Each mistyped value of each field is either a setup that runs or refused with the field named."""
    import yaml

    for value in MISTYPED:
        path = tmp_path / "setup.yaml"
        path.write_text(yaml.safe_dump({"model": "tiny-gpt-neox", field: value}))
        code, _, err = cli(capsys, ["estimate", "--config", str(path), *FAST, "--json"])
        assert code in (0, 2), (field, value, err)
        assert code == 0 or _named(problem_lines(err, "estimate"), field), (field, value, err)


@pytest.mark.parametrize("flag", list(__import__("trainmem.cli.options", fromlist=["x"]).SETUP_FLAGS))
def test_every_flag_mistyped(capsys, flag):
    """Each mistyped text of each setup flag is either a setup that runs or refused with the flag named."""
    for text in MISTYPED_TEXT:
        code, out, err = cli(capsys, ["estimate", *TINY, f"{flag}={text}", *FAST, "--json"])
        assert code in (0, 2), (flag, text, err)
        assert code == 0 or _named(problem_lines(err, "estimate"), flag[2:].replace("-", "_")), (flag, text, err)
        assert "NaN" not in out and "Infinity" not in out


def test_a_command_offers_only_the_flags_it_uses(capsys, paths, tmp_path):
    """Flags a command does not use are not in its --help, and given anyway they are refused with the command's
    other problems; the same fields in a --config file are taken (one file serves run and estimate alike)."""
    from trainmem.cli.options import NOT_USED, SETUP_FLAGS

    flags = {name: flag for flag, (name, _) in SETUP_FLAGS.items()}
    for command, unused in NOT_USED.items():
        _, out, _ = cli(capsys, [command, "--help"])
        offered = re.findall(r"^\s+(--[a-z-]+)", out, re.M) + re.findall(r"\[(--[a-z-]+)", out)
        assert offered and not [flags[n] for n in unused if flags[n] in offered], command
    _, out, _ = cli(capsys, ["run", "--help"])
    # run takes every setup flag but those pricing other machines (--nodes, --gpus-per-node, --network)
    assert all(re.search(rf"^\s+{flag} X", out, re.M) for flag, (name, _) in SETUP_FLAGS.items()
               if name not in NOT_USED["run"])
    code, _, err = cli(capsys, ["estimate", *TINY, "--seed", "3", "--rank", "1", "--lr", "0", *FAST])
    assert code == 2 and [p.split(":")[0] for p in problem_lines(err, "estimate")] == ["--rank", "--seed", "--lr"]
    config = tmp_path / "run.yaml"
    config.write_text("model: tiny-gpt-neox\nengine: trainer\nsteps: 5\nseed: 3\n")
    assert estimate_json(capsys, ["--config", str(config), *FAST])["setup"]["engine"] == "trainer"
    code, out, err = cli(capsys, ["sweep", *TINY, "--method", "estimate", "--estimator", "analytic", "--out",
                                  str(tmp_path / "rows.jsonl"), "--device", "cpu", "--batch-size", "1"])
    assert code == 0, err


def test_one_gpu_shards_only_to_offload(capsys):
    """Sharding over one GPU changes nothing and is refused; offloading from one GPU (ZeRO-Offload) is a use."""
    row = estimate_json(capsys, [*TINY, "--shard", "zero2", "--offload", "optimizer", *FAST])
    assert (row["setup"]["gpus"], row["setup"]["shard"], row["setup"]["offload"]) == (1, "zero2", "optimizer")


def test_lora_values_count_only_where_given(capsys, paths):
    """LoRA's defaults (r 8, alpha 32, dropout 0.05) never make --peft none a problem; values given do, from a flag
    or a file; a bad --peft is reported alone, not with the LoRA values it would have used; a plan that may switch
    LoRA on (--allow peft) takes them for its LoRA options."""
    assert estimate_json(capsys, [*TINY, "--peft", "none", *FAST])["setup"]["lora_r"] == 8
    row = estimate_json(capsys, ["--config", paths["lora-r-peft-lora.yaml"], *FAST])
    assert (row["setup"]["peft"], row["setup"]["lora_r"]) == ("lora", 64)
    code, _, err = cli(capsys, ["estimate", *TINY, "--peft", "adapter", "--lora-r", "64", *FAST])
    assert code == 2 and problem_lines(err, "estimate") == ["--peft: 'adapter' is not one of none, lora, qlora"]
    code, out, err = cli(capsys, ["plan", *TINY, "--gpu", "T4", "--target-batch", "4", "--allow", "peft",
                                  "--lora-r", "16", "--finalists", "0", "--json"])
    assert code == 0, err
    options = json.loads(out)["options"]
    assert {o["setup"]["lora_r"] for o in options if o["setup"]["peft"] != "none"} == {16}


def test_tight_says_what_to_cut_and_fits_does_not():
    from trainmem.output.render import headline
    from trainmem.result import Result

    GiB = 2**30
    verdict = {"gpu": "T4", "fits": False, "level": "tight", "headroom": -GiB // 10, "need": int(14.45 * GiB),
               "capacity": int(14.75 * GiB), "margin": 0.02, "advice": "activations: add --checkpointing",
               "runtime": "T4"}
    row = Result(kind="estimate", status="ok", setup={}, model={}, verdict=verdict)
    assert str(headline(row)) == ("fits T4 tightly: needs 14.4 GiB of 14.8, 0.3 GiB free, less than the 2% margin; "
                                  "cut first: activations: add --checkpointing")
    fits = {**verdict, "level": "fits", "fits": True, "headroom": 4 * GiB, "need": 10 * GiB}
    assert str(headline(Result(kind="estimate", status="ok", setup={}, model={}, verdict=fits))) == (
        "fits T4: needs 10.0 GiB of 14.8, 4.0 GiB free beyond the 2% margin")


@pytest.mark.parametrize("args,message", [
    (["--model", "tiny-olmoe", "--lora-experts"], "--lora-experts: applies to --peft lora or qlora, and --peft is none"),
    (["--model", "tiny-olmoe", "--peft", "lora", "--lora-experts"], "add --lora-dropout 0"),
    (["--model", "tiny-olmoe", "--peft", "lora", "--lora-experts", "--lora-dropout", "0", "--precision", "amp-bf16"],
     "not modelled under autocast"),
    (["--model", "tiny-llama", "--peft", "lora", "--lora-experts", "--lora-dropout", "0"], "has no fused expert weights"),
])
def test_lora_experts_names_what_it_needs(args, message):
    r = subprocess.run([sys.executable, "-m", "trainmem", "estimate", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
