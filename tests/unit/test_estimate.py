"""The estimator: exact model states, hand-computed analytic terms, and the two methods agreeing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import trainmem
from trainmem import ModelSpec, SetupError, TrainSetup, estimate
from trainmem.estimator.memory import analytic, quantized, states
from trainmem.hardware.gpus import CATALOG, find_gpu
from trainmem.isolation.engines import execute

TINY = dict(batch_size=2, seq_len=32, steps=2, num_samples=8, device="cpu")


@pytest.mark.parametrize("kw", [dict(), dict(peft="lora"), dict(optimizer="sgd"), dict(optimizer="adafactor"),
                                dict(precision="bf16")])
def test_model_states_equal_a_real_run(kw):
    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(**TINY, **kw)
    measured = execute(spec, setup).model_states
    b = estimate(spec, setup.replace(precision=setup.resolved_precision(spec, "cpu")), "analytic")
    assert b.model_states == measured


def test_quantized_bytes_by_hand():
    # 4096 values: 2048 packed bytes, 64 uint8 absmax, 1 fp32 nested absmax, 1 KiB nested code, 64 B NF4 code
    assert states.quantized_bytes(4096) == 2048 + 64 + 4 + 1024 + 64


def test_layer_term_by_hand_llama_and_neox():
    llama = analytic.Traits.of(states.meta_model(ModelSpec.resolve("tiny-llama"), TrainSetup(), "bf16"))
    assert (llama.hidden, llama.ffn, llama.heads, llama.kv_width, llama.norm, llama.gated_mlp) == (64, 176, 4, 32, "rms", True)
    T = 2 * 32
    norms = 2 * ((4 + 2 + 2) * 64 * T + 4 * T)
    qkv = 2 * (64 + 2 * 32) * T
    attn_out = 2 * 2 * 64 * T
    lse = 4 * 4 * T
    mlp = 4 * 2 * 176 * T
    assert analytic.layer_saved(llama, T, 32, e=2, r=2, eager=False) == norms + qkv + attn_out + lse + mlp
    neox = analytic.Traits.of(states.meta_model(ModelSpec.resolve("tiny-gpt-neox"), TrainSetup(), "bf16"))
    assert neox.fused_qkv and neox.parallel_residual and neox.rotary and neox.norm == "layer"
    expected = ((2 + 2 * 2) * 64 * T + 16 * T) + (2 * 192 * T + 2 * 128 * T) + 2 * 2 * 64 * T + 4 * 4 * T + 2 * 2 * 256 * T
    assert analytic.layer_saved(neox, T, 32, e=2, r=2, eager=False) == expected


@pytest.mark.parametrize("name", ["tiny-gpt-neox", "tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("kw", [dict(batch_size=8, seq_len=256), dict(batch_size=8, seq_len=256, peft="lora"),
                                dict(batch_size=8, seq_len=256, checkpointing=True),
                                dict(batch_size=8, seq_len=256, peft="qlora"),
                                dict(batch_size=8, seq_len=256, optimizer="adamw-8bit")])
def test_analytic_and_simulate_agree_on_tiny_models(name, kw):
    spec = ModelSpec.resolve(name)
    setup = TrainSetup(precision="bf16", **kw)
    a, s = estimate(spec, setup, "analytic"), estimate(spec, setup, "simulate")
    assert a.model_states == s.model_states
    assert abs(a.peak - s.peak) / s.peak < 0.05, (a.memory, s.memory)


def test_breakdown_adds_up_and_verdict():
    spec = ModelSpec.resolve("polyglot-ko-1.3b")
    big = estimate(spec, TrainSetup(batch_size=16, precision="fp16"), "analytic")
    m = big.memory
    assert m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["other"] == m["peak_allocated"]
    assert m["device_used"] > m["peak_reserved"] > m["peak_allocated"]
    v = big.verdict("T4")
    assert v["fits"] is False and v["headroom"] < 0 and v["cut_first"] == "activations"
    assert big.fits("A100-80GB")
    assert v["advice"].startswith("activations: add --checkpointing")
    qlora = estimate(spec, TrainSetup(batch_size=1, precision="bf16", peft="qlora"), "analytic").verdict("T4")
    assert qlora["cut_first"] == "weights" and "already 4-bit" in qlora["advice"]
    small = estimate(spec, TrainSetup(batch_size=4, precision="fp16"), "analytic")
    assert small.peak_phase == "optimizer step" and small.memory["activations"] == 0


@pytest.mark.parametrize("kw", [dict(peft="qlora"), dict(peft="qlora", checkpointing=True),
                                dict(optimizer="adamw-8bit"), dict(peft="lora", optimizer="adamw-8bit")])
def test_simulated_bitsandbytes_states_equal_the_closed_form_rules(kw):
    """The meta stand-ins (estimator/quantized.py) hold exactly the NF4 and 8-bit Adam bytes that
    states.py computes and that H200 runs measured (docs/lab/estimate-validation.md)."""
    from trainmem.estimator.memory.simulate import simulate_step

    spec = ModelSpec.resolve("tiny-gpt-neox")
    setup = TrainSetup(precision="bf16", batch_size=2, seq_len=32, **kw)
    b = estimate(spec, setup, "simulate")
    assert b.method == "simulate"
    inv = states.inventory(spec, setup, "bf16")
    from trainmem.estimator.memory.simulate import model_builder

    ledger, final = simulate_step(model_builder(spec, setup, "bf16", CATALOG["H200"]), setup)
    assert (final.weights, final.optimizer) == (states.weights(inv), states.optimizer(inv, setup.optimizer))


def test_gpt2_qlora_quantizes_its_conv1d_layers_as_transformers_does():
    """transformers' replace_with_bnb_linear converts GPT-2's Conv1D (transposed) and exact nn.Linear, not the
    head: QLoRA's weights are the NF4 bytes of every Conv1D plus the rest in fp32, below LoRA's 16-bit weights
    for GPT-2 (124M), and the 4-bit stand-in holds exactly those bytes."""
    from trainmem.estimator.memory.simulate import model_builder, simulate_step

    setup = TrainSetup(precision="bf16", batch_size=2, seq_len=32, peft="qlora")
    gpt2 = states.inventory(ModelSpec.resolve("gpt2"), setup, "bf16")
    conv = [p for p in gpt2.params if p.name.endswith(".weight") and "lora_" not in p.name
            and any(f".{c}." in p.name for c in ("c_attn", "c_proj", "c_fc"))]  # c_attn wrapped by its adapter
    assert len(conv) == 4 * 12 and all(p.quantized for p in conv)
    lora = states.inventory(ModelSpec.resolve("gpt2"), setup.replace(peft="lora"), "bf16")
    assert states.weights(gpt2) < states.weights(lora)
    tiny = ModelSpec.resolve("tiny-gpt2")
    _, final = simulate_step(model_builder(tiny, setup, "bf16", CATALOG["H200"]), setup)
    assert final.weights == states.weights(states.inventory(tiny, setup, "bf16"))


def test_qlora_on_the_hybrids_estimates_and_mamba_is_refused(tmp_path):
    """transformers' quantizer marks a 4-bit model's config `_is_quantized`, and Jamba's (and Falcon-Mamba's)
    mixer then calls its 4-bit dt_proj as a layer instead of multiplying by its packed uint8 weight: the
    simulation marks it too, so QLoRA estimates on Jamba and the other hybrids. Mamba's mixer multiplies by the
    weight whatever the mark (it would fail on a GPU too): one line naming --peft qlora refuses it, and the
    simulation without that refusal still fails, so the refusal is not stale."""
    from lab import registry
    from trainmem.config.specs import QLORA_REFUSED
    from trainmem.estimator.memory.simulate import model_builder, simulate_step

    setup = TrainSetup(batch_size=1, seq_len=16, precision="bf16", peft="qlora", lora_r=4)
    for t in ("jamba", "falcon_h1", "granitemoehybrid", "bamba", "zamba2", "mamba"):
        registry.tiny_config(t).save_pretrained(tmp_path / t)
    for t in ("jamba", "falcon_h1", "granitemoehybrid", "bamba", "zamba2"):
        r = estimate(ModelSpec.resolve(str(tmp_path / t / "config.json")), setup, "simulate")
        assert r.method == "simulate" and r.peak > r.model_states["weights"] > 0, t
    mamba = ModelSpec.resolve(str(tmp_path / "mamba" / "config.json"))
    with pytest.raises(SetupError) as e:
        estimate(mamba, setup, "simulate")
    [line] = e.value.problems
    assert line.startswith("--peft qlora: ") and line.endswith("use --peft lora") and "dt_proj" in line
    assert mamba.qlora_refusal == QLORA_REFUSED["MambaMixer"]
    with pytest.raises(RuntimeError, match="uint8"):
        simulate_step(model_builder(mamba, setup.resolved(mamba), "bf16", CATALOG["H200"]), setup.resolved(mamba))


@pytest.mark.parametrize("module_class, model_type, weight", [
    ("Gemma3nTextAltUp", "gemma3n_text", "prediction_coefs"),
    ("LongcatFlashTopkRouter", "longcat_flash", "classifier")])
def test_qlora_is_refused_where_a_module_reads_a_4bit_weight(tmp_path, module_class, model_type, weight):
    """Gemma-3n's AltUp clamps its `prediction_coefs` weight in place in training and LongCat-Flash's router
    multiplies by its `classifier` weight, both packed uint8 under 4 bits (a GPU run fails too): one line naming
    --peft qlora refuses each, and the simulation without that refusal still fails, so the refusal is not stale."""
    from lab import registry
    from trainmem.config.specs import QLORA_REFUSED
    from trainmem.estimator.memory.simulate import model_builder, simulate_step

    setup = TrainSetup(batch_size=1, seq_len=16, precision="bf16", peft="qlora", lora_r=4)
    registry.tiny_config(model_type).save_pretrained(tmp_path)
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    with pytest.raises(SetupError) as e:
        estimate(spec, setup, "simulate")
    [line] = e.value.problems
    assert line.startswith("--peft qlora: ") and line.endswith("use --peft lora") and weight in line
    assert spec.qlora_refusal == QLORA_REFUSED[module_class]
    with pytest.raises(RuntimeError, match="uint8|reduction dim"):
        simulate_step(model_builder(spec, setup.resolved(spec), "bf16", CATALOG["H200"]), setup.resolved(spec))


def test_targets_peft_turns_into_fused_experts_are_refused_without_dropout_0(tmp_path):
    """On a mixture of experts whose experts transformers 5 fuses (AFMoE), peft turns all-linear's expert names
    into the fused 3-D weights and adapts those without dropout, and refuses one half of a fused pair: each a
    line naming --lora-targets (peft itself raised an internal error); with --lora-dropout 0 it simulates."""
    from lab import registry

    registry.tiny_config("afmoe").save_pretrained(tmp_path)
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    setup = TrainSetup(batch_size=1, seq_len=16, precision="fp32", peft="lora", lora_r=4, lora_targets=["all-linear"])
    for bad, words in ((setup, ("--lora-targets all-linear: ", "gate_up_proj", "add --lora-dropout 0")),
                       (setup.replace(lora_targets=["gate_proj"]), ("--lora-targets gate_proj: ", "up_proj"))):
        with pytest.raises(SetupError) as e:
            estimate(spec, bad, "simulate")
        [line] = e.value.problems
        assert line.startswith(words[0]) and all(w in line for w in words[1:]), line
    r = estimate(spec, setup.replace(lora_dropout=0.0), "simulate")
    assert r.method == "simulate" and r.model_states["gradients"] > estimate(spec, setup.replace(
        lora_targets=["q_proj"]), "simulate").model_states["gradients"]


def test_simulation_records_the_build_and_cublas_workspaces_as_a_gpu_run_does():
    from trainmem.estimator.memory.simulate import model_builder, simulate_step
    from trainmem.hardware import cuda
    from trainmem.measure.ledger import EMPTY_CACHE

    spec = ModelSpec.resolve("tiny-qwen2")  # tied output head: allocated, then freed when tied
    setup = TrainSetup(precision="bf16", batch_size=2, seq_len=32)
    ledger, _ = simulate_step(model_builder(spec, setup, "bf16", CATALOG["H200"]), setup)
    sizes = {k: n for k, n in ledger.events if n >= 0}
    head = spec.config["vocab_size"] * spec.config["hidden_size"] * 2
    workspace = cuda.cublas_workspace((9, 0))
    holds = [i for i, (k, n) in enumerate(ledger.events) if n == workspace]
    frees = [i for i, (k, n) in enumerate(ledger.events) if n == -1 and sizes[k] == head]
    assert len(holds) == cuda.CUBLAS_HANDLES  # one per handle, at its first matrix product
    assert frees and frees[0] < holds[0]  # the untied head goes during the build, before any product
    qlora = simulate_step(model_builder(spec, setup.replace(peft="qlora"), "bf16", CATALOG["H200"]),
                          setup.replace(peft="qlora"))[0]
    assert (EMPTY_CACHE, 0) in qlora.events  # peft empties the cache after its fp32 casts
    base = states.meta_model(spec, setup, "bf16")
    warmup = quantized.warmup_bytes(base, states.quantizable(base))
    i = [n for _, n in qlora.events].index(warmup)  # transformers' warm-up block, freed before the load
    assert qlora.events[i + 1] == (qlora.events[i][0], -1)
    assert max((n for _, n in qlora.events[:i]), default=0) < warmup // 8


def test_the_4bit_load_goes_in_the_checkpoints_sorted_key_order():
    """safetensors sorts a checkpoint's keys and transformers loads in that order (H200 traces of held-out 6):
    GPT-NeoX's `attention.dense` (h x h) comes before `attention.query_key_value` (3h x h), the reverse of the
    module order; each quantized weight is first copied to the device in 16 bits."""
    from trainmem.estimator.memory.simulate import model_builder, simulate_step

    spec = ModelSpec.resolve("tiny-gpt-neox")
    setup = TrainSetup(precision="bf16", batch_size=1, seq_len=8, peft="qlora")
    h = spec.config["hidden_size"]
    ledger, _ = simulate_step(model_builder(spec, setup, "bf16", CATALOG["H200"]), setup)
    copies = [n for _, n in ledger.events if n in (2 * h * h, 2 * 3 * h * h)]
    assert copies[:2] == [2 * h * h, 2 * 3 * h * h]


def test_the_math_attention_paths_safe_softmax_allocates_its_mask_inside():
    """fp32 with grouped KV heads runs SDPA's math path, whose `_safe_softmax` is one operator to the ledger
    but allocates, after its probabilities, a boolean (b, h, s, s) test and its (b, h, s) row reduction,
    freed before it returns (H200 trace of held-out 8's llama-3.2-3b QLoRA row; tests/gpu checks CUDA)."""
    from trainmem.estimator.memory.simulate import model_builder, simulate_step

    spec = ModelSpec.resolve("tiny-llama")  # 4 heads over 2 KV heads
    setup = TrainSetup(precision="fp32", batch_size=2, seq_len=16, steps=1).resolved(spec)
    ledger, _ = simulate_step(model_builder(spec, setup, "fp32", CATALOG["H200"]), setup)
    probs, mask, rows = 4 * 2 * 4 * 16 * 16, 2 * 4 * 16 * 16, 2 * 4 * 16
    sizes = [n for _, n in ledger.events]
    # the probabilities, then the mask and the rows, each freed at once
    assert any(sizes[i:i + 5] == [probs, mask, -1, rows, -1] for i in range(len(sizes)))
    bf16 = TrainSetup(precision="bf16", batch_size=2, seq_len=16, steps=1).resolved(spec)  # flash: no mask
    ledger, _ = simulate_step(model_builder(spec, bf16, "bf16", CATALOG["H200"]), bf16)
    sizes = [n for _, n in ledger.events]
    assert not any(sizes[i:i + 4] == [mask, -1, rows, -1] for i in range(len(sizes)))


def test_peft_clones_the_4bit_output_after_the_layers_compute_copy_is_freed():
    """peft's 4-bit LoRA layer clones what the base layer returned; by then the base layer's bf16 copy of
    its fp32 input and its bf16 product are freed (H200 trace of held-out 8's mistral-7b QLoRA row)."""
    import torch

    from trainmem.measure.ledger import StateBytes, TensorLedger

    layer = quantized.Linear4bit(torch.nn.Linear(64, 32, device="meta"), torch.bfloat16)
    layer.lora_clone = True
    x = torch.empty(8, 64, device="meta")  # fp32, as prepare_model_for_kbit_training leaves the stream
    ledger = TensorLedger(lambda: StateBytes(0, 0, 0)).record()
    with ledger:
        y = layer(x)
    sizes = {}
    order = []
    for key, n in ledger.events:
        if n > 0:
            sizes[key] = n
            order.append(("alloc", n))
        else:
            order.append(("free", sizes[key]))
    copy, product, cast = 2 * 8 * 64, 2 * 8 * 32, 4 * 8 * 32
    clone = len(order) - 1 - order[::-1].index(("alloc", cast))  # the last fp32 output is the clone
    assert order.index(("alloc", cast)) < clone  # the base layer's own output came first
    assert ("free", copy) in order[:clone] and ("free", product) in order[:clone]
    assert y.dtype == torch.float32


def test_the_4bit_forward_keeps_both_absmax_buffers_until_the_product_exists():
    """bitsandbytes 0.50's `_dequant_linear_fallback`: the restored absmax and its offset copy (fp32), the
    16-bit weight, the product, and only then the three freed (H200 trace of held-out 7's phi-3-mini row)."""
    import torch

    from trainmem.measure.ledger import StateBytes, TensorLedger

    layer = quantized.Linear4bit(torch.nn.Linear(4096, 64, bias=False, device="meta"), torch.bfloat16)
    x = torch.empty(8, 4096, device="meta", dtype=torch.bfloat16)
    ledger = TensorLedger(lambda: StateBytes(0, 0, 0)).record()
    with ledger:
        y = layer(x)
    absmax, weight, product = 4 * layer.blocks, 2 * 4096 * 64, 2 * 8 * 64
    assert [n for _, n in ledger.events] == [absmax, absmax, weight, product, -1, -1, -1]
    assert y.shape == (8, 64)


def test_the_4bit_warmup_is_what_transformers_allocated_on_the_h200():
    """gemma-2-2b's 4-bit load on the H200 (held-out 6, row 2) warmed the allocator up with exactly this many
    bytes (allocator trace, docs/lab/data/trace-held-out-6-qlora-rows-h200-2026-12-04.json.gz): tied head left out,
    quantized weights at half a byte, embeddings and norms at two."""
    spec = ModelSpec.resolve("gemma-2-2b")
    base = states.meta_model(spec, TrainSetup(precision="bf16", batch_size=1, seq_len=8), "bf16")
    assert quantized.warmup_bytes(base, states.quantizable(base)) == 2192269824
    assert quantized.warmup_bytes(base, states.quantizable(base), device_total=2**31) == 2**31 - int(1.2 * 2**30)


def test_a_qlora_run_that_fits_three_steps_and_runs_out_in_the_fourth_is_judged_no():
    """Held-out 10's mistral-7b QLoRA at 13120 tokens under the A10G's cap ran three steps on the H200 and ran
    out in the fourth (2026-12-04): the three simulated steps fit (`tight`), the replay of the steady step
    repeated until the allocator's layout settles runs out, as the real run did."""
    spec = ModelSpec.resolve("mistral-7b")
    setup = TrainSetup(precision="bf16", batch_size=1, seq_len=13120, peft="qlora", checkpointing=True,
                       lora_targets=["all-linear"], lora_r=16, gpu="A10G")
    b = estimate(spec, setup, "simulate")
    assert b.verdict("A10G")["level"] == "no"
    assert any("does not fit the" in n for n in b.notes)


def test_methods_and_fallbacks():
    spec = ModelSpec.resolve("tiny-llama")
    for precision in ("amp-bf16", "amp-fp16", "bf16", "fp32"):  # auto simulates every single-GPU setup
        assert estimate(spec, TrainSetup(precision=precision)).method == "simulate"
    sharded = estimate(spec, TrainSetup(precision="bf16", gpus=2, shard="zero3"), "simulate")
    assert sharded.method == "analytic" and "analytic method only" in sharded.notes[0]
    assert estimate(spec, TrainSetup(precision="bf16", gpus=2, shard="zero2")).method == "simulate"
    with pytest.raises(SetupError, match="--method: 'guess'"):
        estimate(spec, TrainSetup(), "guess")
    with pytest.raises(SetupError, match="--batch-size"):
        estimate(spec, TrainSetup(batch_size=0))


def test_parameters_the_loss_never_reaches_get_no_gradient_nor_optimizer_state(tmp_path):
    """BART's decoder-only causal LM has cross-attention with no encoder to attend to: its weights take no gradient
    in a real step, so neither a gradient nor AdamW's two moments and step are counted for them."""
    from lab import registry

    registry.tiny_config("bart").save_pretrained(tmp_path)
    spec = ModelSpec.resolve(str(tmp_path / "config.json"))
    setup = TrainSetup(batch_size=2, seq_len=32, precision="fp32", device="cpu")
    inv = states.inventory(spec, setup, "fp32")
    unreached = [p for p in inv.params if p.trainable and not p.reached]
    assert unreached and all(".encoder_attn" in p.name for p in unreached)
    cross = sum(p.numel for p in unreached)
    assert states.gradients(inv) == 4 * (sum(p.numel for p in inv.params) - cross)
    assert states.optimizer(inv, "adamw") == sum(8 * p.numel + 4 for p in inv.params if p.updated)


def test_estimate_cli_json_and_errors():
    cmd = [sys.executable, "-m", "trainmem.cli", "estimate", "--model", "polyglot-ko-1.3b", "--precision", "fp16",
           "--batch-size", "16", "--gpu", "T4", "--method", "analytic", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    row = json.loads(out.stdout)
    assert row["kind"] == "estimate" and row["method"] == "analytic" and row["schema"] == "trainmem.result/1"
    assert set(row["memory"]) >= {"weights", "gradients", "optimizer", "activations", "other",
                                  "peak_allocated", "peak_reserved", "device_used"}
    assert row["verdict"]["gpu"] == "T4" and row["verdict"]["fits"] is False
    bad = subprocess.run([sys.executable, "-m", "trainmem.cli", "estimate", "--batch-size", "x", "--peft", "dora"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "--batch-size: expected a whole number, got 'x'" in bad.stderr and "--peft: 'dora'" in bad.stderr


def test_zero_paper_example_per_gpu_states():
    """ZeRO paper, Figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam (2 + 2 + 12 bytes)."""
    from trainmem.estimator.memory.sharding import rank_states

    psi, n = 7_500_000_000, 64
    expected = {"none": 120e9, "zero1": 31.4e9, "zero2": 16.6e9, "zero3": 1.9e9}
    for shard, gb in expected.items():
        r = rank_states(2 * psi, 2 * psi, 12 * psi, psi, True, n if shard != "none" else 1, shard, "none", 0, False)
        assert abs((r.weights + r.gradients + r.optimizer) - gb) / gb < 0.02, shard


def test_sharded_estimates_shrink_with_more_gpus_and_zero_runs_are_refused():
    spec = ModelSpec.resolve("llama-3.1-8b")
    peaks = [estimate(spec, TrainSetup(batch_size=1, precision="bf16", gpus=n, shard="zero3")).peak
             for n in (2, 4, 8)]
    assert peaks[0] > peaks[1] > peaks[2]
    z2 = estimate(spec, TrainSetup(batch_size=1, precision="bf16", gpus=8, shard="zero2"))
    assert z2.method == "simulate" and z2.memory["optimizer"] == 12 * spec.parameter_count // 8
    assert z2.to_result().effective_batch == 8
    off = estimate(spec, TrainSetup(batch_size=1, precision="bf16", gpus=8, shard="zero3", offload="optimizer"))
    assert off.memory["optimizer"] == 0
    with pytest.raises(SetupError, match="--gpus 4: say how states are spread"):
        estimate(spec, TrainSetup(gpus=4))
    with pytest.raises(SetupError, match="--offload params: only ZeRO-3 and FSDP"):
        estimate(spec, TrainSetup(gpus=4, shard="zero2", offload="params"))
    with pytest.raises(SetupError, match="add --engine deepspeed"):
        execute(ModelSpec.resolve("tiny-llama"), TrainSetup(gpus=2, shard="zero2", **TINY))


# --- attention as transformers picks it ------------------------------------------------------------
# GraniteSWA is a causal LM whose transformers class declares `_supports_sdpa = False` (so is Gemma-2 from
# transformers 5.24 on): transformers builds it with eager attention unless asked, and refuses sdpa.
TINY_NO_SDPA = dict(model_type="granite_swa", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=176, vocab_size=1024, max_position_embeddings=512,
                    bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, dtype="bfloat16")


def test_auto_attention_is_what_transformers_picks():
    llama, granite = ModelSpec.resolve("tiny-llama"), ModelSpec("tiny-granite-swa", TINY_NO_SDPA, "config")
    assert llama.attentions == ("sdpa", "eager") and granite.attentions == ("eager",)
    assert granite.model_class.__name__ == "GraniteSWAForCausalLM" and not granite.model_class._supports_sdpa
    assert TrainSetup().attention == "auto" and TrainSetup().validate(llama).attention == "sdpa"
    assert TrainSetup().validate(granite).attention == "eager"


def test_auto_attention_on_a_model_that_refuses_sdpa_estimates_eager():
    from transformers import __version__ as version

    spec = ModelSpec("tiny-granite-swa", TINY_NO_SDPA, "config")
    setup = TrainSetup(batch_size=2, seq_len=64, precision="bf16")
    for method in ("analytic", "simulate"):
        auto = estimate(spec, setup, method).to_result(None, 0.02)
        eager = estimate(spec, setup.replace(attention="eager"), method).to_result(None, 0.02)
        assert auto.setup["attention"] == "eager" and auto.memory == eager.memory
        assert f"eager attention: GraniteSWAForCausalLM does not support SDPA in transformers {version}" in auto.notes
    with pytest.raises(SetupError) as e:
        estimate(spec, setup.replace(attention="sdpa"))
    assert str(e.value).startswith("- --attention: tiny-granite-swa (GraniteSWAForCausalLM) does not support sdpa "
                                   "in transformers ")
    assert str(e.value).endswith("use --attention eager, or auto")


def test_gemma2_estimates_with_auto_attention_in_every_transformers():
    # transformers 5.24 dropped Gemma-2's SDPA (it cannot softcap); 5.17 has it: auto follows either
    from transformers import Gemma2ForCausalLM

    spec = ModelSpec("tiny-gemma2", {**TINY_NO_SDPA, "model_type": "gemma2", "head_dim": 16}, "config")
    r = estimate(spec, TrainSetup(batch_size=2, seq_len=64, precision="bf16")).to_result()
    assert r.setup["attention"] == ("sdpa" if Gemma2ForCausalLM._supports_sdpa else "eager")
    assert r.memory["peak_allocated"] > r.model_states["weights"] > 0


def test_explicit_sdpa_on_a_model_that_refuses_it_is_a_setup_error_in_the_cli(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_NO_SDPA))
    cli = [sys.executable, "-m", "trainmem.cli", "estimate", "--model", str(cfg), "--method", "analytic"]
    p = subprocess.run(cli + ["--attention", "sdpa"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "(GraniteSWAForCausalLM) does not support sdpa" in " ".join(p.stderr.split())
    row = json.loads(subprocess.run(cli + ["--json"], capture_output=True, text=True, check=True).stdout)
    assert row["setup"]["attention"] == "eager" and any(n.startswith("eager attention: GraniteSWA") for n in row["notes"])


def test_estimate_says_which_versions_its_kernel_model_was_validated_on(monkeypatch):
    import torch
    import transformers

    from trainmem.estimator.memory import runtime

    b = estimate("tiny-llama", TrainSetup(batch_size=2, seq_len=32), "analytic")
    stamp = {k: b.env[k] for k in ("trainmem", "commit", "dirty", "utc")}  # where and when it was made
    assert b.env == {"torch": torch.__version__, "transformers": transformers.__version__, **stamp,
                     "validated_on": {"torch": "2.11", "transformers": "5.17"}} == b.to_result().env
    assert stamp["utc"].endswith("+00:00") and stamp["trainmem"] == trainmem.__version__
    assert runtime.version_note({"torch": "2.11.0+cu130", "transformers": "5.17.0"}) is None
    assert runtime.version_note({"torch": "2.13.0+cpu", "transformers": "5.17.0"}).startswith(
        "installed torch 2.13.0+cpu: the kernel memory model was validated on torch 2.11 + transformers 5.17 (H200")
    monkeypatch.setattr(runtime, "versions", lambda: {"torch": "2.11.0", "transformers": "5.24.0"})
    assert estimate("tiny-llama", TrainSetup(batch_size=2, seq_len=32), "analytic").notes[-1].startswith(
        "installed transformers 5.24.0: the kernel memory model was validated on")
    monkeypatch.setattr(runtime, "versions", lambda: {"torch": "2.11.0", "transformers": "5.17.2"})
    assert not any("validated on" in n for n in estimate("tiny-llama", TrainSetup(batch_size=2, seq_len=32)).notes)


def test_qlora_says_which_weights_stay_unquantized_and_advises_lora(tmp_path):
    """bitsandbytes quantizes nn.Linear and Conv1D only: a mixture of experts' fused 3-D weights and Falcon's
    FalconLinear stay in the load dtype and peft's prepare_model_for_kbit_training casts them to fp32. Where they
    are most of the weights the estimate says so, and the advice for weights is LoRA in bf16, not 'already
    4-bit'; a Llama's QLoRA says nothing of it."""
    from trainmem.estimator.breakdown import UNQUANTIZED_ADVICE, advice
    from lab import registry

    registry.tiny_config("falcon").save_pretrained(tmp_path)
    setup = TrainSetup(batch_size=1, seq_len=32, precision="bf16", peft="qlora")
    cases = {"tiny-mixtral": "fused expert weights", str(tmp_path / "config.json"): "FalconLinear layers"}
    for model, kind in cases.items():
        r = estimate(ModelSpec.resolve(model), setup, "analytic")
        assert any(n.startswith("QLoRA: ") and f"({kind})" in n for n in r.notes), r.notes
        assert r.terms["unquantized_weights"] * 2 > r.model_states["weights"]
    llama = estimate(ModelSpec.resolve("tiny-llama"), setup, "analytic")
    assert "unquantized_weights" not in llama.terms and not any(n.startswith("QLoRA: ") for n in llama.notes)
    assert advice("weights", "qlora", True) == UNQUANTIZED_ADVICE and "already 4-bit" in advice("weights", "qlora")


def test_advice_suggests_only_what_the_setup_does_not_do_and_what_lowers_the_part():
    """The first cut never names a flag or value the setup already has (--checkpointing on, adamw-8bit set, FSDP
    already sharding the weights), nor a change that leaves the part as it is: adamw-fused saves only foreach
    AdamW's step copies, so only at an optimizer-step peak that they mostly make; a smaller batch shrinks the
    logits, which are not alive at the optimizer step; 8-bit AdamW is no saving over SGD or Adafactor."""
    from trainmem.estimator.breakdown import ADAPTERS_ADVICE, ADVICE, advice

    plain = dict(batch_size=4, checkpointing=False, optimizer="adamw", shard="none", gpus=1)
    for cut in ADVICE:  # a setup that does none of it gets the whole advice
        for peft in ("none", "lora"):
            assert advice(cut, peft, setup=plain, phase="optimizer step" if cut == "optimizer" else None) == \
                advice(cut, peft), (cut, peft)
    ckpt = {**plain, "checkpointing": True}
    assert advice("activations", "none", setup=ckpt, phase="forward/backward") == (
        "activations: lower --batch-size (raise --grad-accum to keep the effective batch)")
    assert advice("activations", "lora", setup={**ckpt, "batch_size": 1}, phase="forward/backward") == (
        "activations: a shorter --seq-len (already checkpointed, at batch 1)")
    for optimizer in ("adamw-8bit", "adafactor", "sgd"):
        assert advice("optimizer", "none", setup={**plain, "optimizer": optimizer}, phase="optimizer step") == (
            "optimizer states: train adapters only with --peft lora")
    assert advice("optimizer", "lora", setup={**plain, "optimizer": "adamw-8bit"}, phase="optimizer step") == (
        "optimizer states: only the adapters have states; a lower --lora-r or fewer --lora-targets")
    assert advice("optimizer", "lora", setup=plain, phase="optimizer step") == ADAPTERS_ADVICE["optimizer"]
    fused = "--optimizer adamw-fused"
    assert advice("other", "none", setup=plain, phase="optimizer step", foreach_share=0.9) == (
        "temporaries: --optimizer adamw-fused (no foreach copies at the step)")
    assert advice("other", "none", setup=plain, phase="forward/backward", foreach_share=0.9) == (
        "temporaries: for large vocabularies, a smaller --batch-size")
    assert fused not in advice("other", "lora", setup=plain, phase="optimizer step", foreach_share=0.01)
    assert fused not in advice("other", "none", setup={**plain, "optimizer": "adamw-fused"}, phase="optimizer step")
    assert fused not in advice("other", "none", setup={**plain, "optimizer": "adamw-8bit"}, phase="optimizer step")
    assert advice("other", "none", setup={**plain, "batch_size": 1}, phase="forward/backward") == (
        "temporaries: the logits and their gradients; a shorter --seq-len")
    sharded = {**plain, "shard": "fsdp", "gpus": 2}
    for unquantized in (False, True):
        said = advice("weights", "qlora", unquantized, sharded, "optimizer step")
        assert "--shard fsdp" not in said and "spread it over more than --gpus 2" in said


def test_the_estimate_advises_from_its_own_setup():
    """End to end: a checkpointed LoRA setup whose peak is its logits (tiny-llama's 32k vocabulary) was told
    adamw-fused, which changes nothing there; full fine-tuning whose largest part is the states of the adamw-8bit
    it already has was told adamw-8bit."""
    lora = estimate("tiny-llama", TrainSetup(peft="lora", batch_size=8, seq_len=256, checkpointing=True), "analytic")
    v = lora.verdict("T4")
    assert (lora.peak_phase, v["cut_first"]) == ("forward/backward", "other")
    assert v["advice"] == "temporaries: for large vocabularies, a smaller --batch-size"
    eight_bit = estimate("polyglot-ko-1.3b", TrainSetup(batch_size=1, seq_len=32, precision="fp16",
                                                        optimizer="adamw-8bit"), "analytic").verdict("T4")
    assert eight_bit["cut_first"] == "optimizer"
    assert eight_bit["advice"] == "optimizer states: train adapters only with --peft lora"


def test_where_the_states_alone_exceed_the_card_they_are_cut_first():
    """llama-3.2-3b full bf16 at batch 8 x 2048 on an A10G: activations are the largest part of the peak, but the
    weights, gradients and AdamW states alone (24 GiB) exceed the card, so no cut of activations can make it fit:
    the part to cut first is the largest of the states, and its advice lowers them."""
    b = estimate("llama-3.2-3b", TrainSetup(precision="bf16", batch_size=8, seq_len=2048), "analytic")
    v = b.verdict("A10G")
    assert b.memory["activations"] > max(b.memory[k] for k in ("weights", "gradients", "optimizer", "other"))
    assert sum(b.model_states.values()) > find_gpu("A10G").capacity
    assert v["cut_first"] == "optimizer" and v["advice"].startswith("optimizer states: --optimizer adamw-8bit")
    assert b.verdict("A100-40GB")["cut_first"] == "activations"  # the states fit there: activations first


def test_a_mixture_of_experts_shows_its_experts_weights_apart():
    """Every expert is held whichever the tokens pick: the breakdown gives the fused experts' bytes apart, the
    terminal as a row under the weights; a dense model has no such row."""
    from rich.console import Console

    from trainmem.output.render import result_tables

    setup = TrainSetup(batch_size=2, seq_len=32, precision="bf16", peft="lora")
    r = estimate(ModelSpec.resolve("tiny-qwen3-moe"), setup, "analytic")
    inv = states.inventory(ModelSpec.resolve("tiny-qwen3-moe"), setup.validate(ModelSpec.resolve("tiny-qwen3-moe")), "bf16")
    experts = [p for p in inv.params if ".mlp.experts." in p.name]
    assert experts and all(len(p.shape) == 3 for p in experts)
    assert r.terms["expert_weights"] == sum(2 * p.numel for p in experts) < r.model_states["weights"]
    console = Console(record=True, width=120)
    for part in result_tables(r.to_result()):
        console.print(part)
    assert "of which experts" in console.export_text()
    assert "expert_weights" not in estimate(ModelSpec.resolve("tiny-llama"), setup, "analytic").terms


def test_lora_on_fused_expert_weights_is_simulated_and_equals_a_cpu_run():
    """`--lora-experts` hands peft the fused 3-D expert weights as `target_parameters`: the adapters' states equal a
    real CPU step's to the byte, the analytic method (no closed form for peft's per-forward rebuilt weights) gives
    way to the simulation, and the rebuilt expert weights the backward keeps raise the peak."""
    from trainmem.isolation.runner import run

    spec = ModelSpec.resolve("tiny-olmoe")
    base = TrainSetup(batch_size=2, seq_len=32, precision="fp32", peft="lora", lora_dropout=0.0, device="cpu")
    setup = base.replace(lora_experts=True)
    simulated, analytic, plain = (estimate(spec, setup, "simulate"), estimate(spec, setup, "analytic"),
                                  estimate(spec, base, "simulate"))
    measured = run(spec, setup.replace(steps=1), isolate=False)
    assert measured.status == "ok", measured.error
    assert simulated.model_states == measured.model_states == analytic.model_states
    assert analytic.method == "simulate"
    assert simulated.model["trainable_parameters"] > plain.model["trainable_parameters"]
    assert simulated.memory["peak_allocated"] > plain.memory["peak_allocated"]


def test_advice_is_checked_by_estimating_each_change(capsys):
    """A setup over its card is told what each suggested change would need, from the same estimate a user would
    get for the changed setup; a setup that fits is told nothing more."""
    from trainmem import cli
    from trainmem.search.advice import changes

    ask = ["estimate", "--model", "tiny-llama", "--batch-size", "16", "--seq-len", "512", "--gpu", "T4", "--json"]
    assert cli.main(ask + ["--memory-cap", "900MiB"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert verdict["level"] == "no" and verdict["cut_first"] == "other"
    checked = {c["change"]: c for c in verdict["checked"]}
    assert list(checked) == ["--optimizer adamw-fused", "--batch-size 8 --grad-accum 2"]
    for flags in (["--optimizer", "adamw-fused"], ["--batch-size", "8", "--grad-accum", "2"]):
        assert cli.main([*ask, "--memory-cap", "900MiB", *flags]) == 0
        alone = json.loads(capsys.readouterr().out)["verdict"]
        assert checked[" ".join(flags)]["need"] == alone["need"]
    assert cli.main(ask) == 0 and "checked" not in json.loads(capsys.readouterr().out)["verdict"]
    already = TrainSetup(batch_size=1, checkpointing=True, optimizer="adamw-8bit", peft="lora")
    assert changes(already, "activations") == [] and changes(already, "optimizer") == []
    assert [c for c, _ in changes(TrainSetup(optimizer="sgd"), "optimizer")] == ["--peft lora"]


def test_advice_whose_states_alone_exceed_the_card_is_answered_without_an_estimate(monkeypatch):
    """A change whose weights, gradients and optimizer states alone exceed the card cannot fit whatever its
    activations: the check says so from the inventory (`states_floor`), a lower bound of what the estimate says,
    and estimates only the changes under the card."""
    from trainmem.cli.options import verdict_card
    from trainmem.estimator import states_floor
    from trainmem.output.render import checked_advice
    from trainmem.search import advice

    card = find_gpu("T4")
    base = TrainSetup(batch_size=2, seq_len=256, precision="fp32", gpu="T4")
    spec = ModelSpec.resolve("qwen2.5-0.5b")  # 0.49 G parameters: 2 GB of fp32 weights
    cap = card.overhead("sdpa", "fp32", "none") + 3 * 2**30
    setup = base.replace(memory_cap=cap)
    capped = verdict_card(setup)
    b = estimate(spec, setup, "analytic")
    assert b.verdict(capped)["cut_first"] == "optimizer"
    estimated: list[TrainSetup] = []
    monkeypatch.setattr(advice, "estimate", lambda sp, s, method, **kw: estimated.append(s) or estimate(sp, s, method, **kw))
    rows = advice.check(spec, setup, b, capped, 0.02, "analytic")
    # 8-bit AdamW keeps 2 GB of weights and 2 GB of gradients: over the cap; LoRA's states are under it: estimated
    assert [(r["change"], r["level"], r.get("floor")) for r in rows] == [
        ("--optimizer adamw-8bit", "no", True), ("--peft lora", "no", None),
        ("--optimizer adamw-8bit --peft lora", "no", None)]
    assert [s.peft for s in estimated] == ["lora", "lora"]
    for flags in ({"optimizer": "adamw-8bit"}, {"peft": "lora"}):
        floor = states_floor(spec, base.replace(**flags), card)
        assert floor <= estimate(spec, base.replace(**flags), "analytic").verdict(card)["need"]
    assert checked_advice(rows, capped.name).startswith(
        "no single change fits the 3.5 GiB cap: --optimizer adamw-8bit: needs over")


def test_a_step_over_several_caps_needs_one_figure_the_smallest_cap_that_runs_it():
    """Every card a step does not fit is told the same need (the page's rows, one simulated step per runtime
    group), found once: the smallest cap on the step's grid under which its replay runs, whatever cap it ran out
    under first; no cap under the step's most live requested bytes holds it."""
    from trainmem.estimator import NEED_RESOLUTION, _NEEDS, _replay, simulated_step
    from trainmem.estimator.memory import allocator
    from trainmem.estimator.memory.simulate import steady_start

    spec = ModelSpec.resolve("tiny-llama")
    setup = TrainSetup(batch_size=4, seq_len=256).validate(spec)
    step = simulated_step(spec, setup, setup.resolved_precision(spec, "cuda"), find_gpu("H100"))
    events, steady = step.events, steady_start(step)
    floor = allocator.live_peak(events)
    with pytest.raises(allocator.AllocatorOOM):
        allocator.replay_steps(events, steady, allocator.CachingAllocator(cap=floor - 1))
    needs = []
    for cap in (floor // 4, floor // 2, floor - 1):
        notes: list[str] = []
        needs.append(_replay(events, steady, cap, notes))
        assert "the step needs" in notes[0]
    assert len({(n.reserved, n.allocated) for n in needs}) == 1 and needs[0].reserved >= floor
    assert _NEEDS[id(events)][0] is events  # found once, kept for the step
    need = needs[0].reserved
    allocator.replay_steps(events, steady, allocator.CachingAllocator(cap=need))
    with pytest.raises(allocator.AllocatorOOM):
        allocator.replay_steps(events, steady, allocator.CachingAllocator(cap=need - NEED_RESOLUTION - 1))
