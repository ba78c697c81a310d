"""The card records (runtime figures and their sources), card names as users write them, bf16 on cards
without it, and the three-valued verdict."""

import pytest
import torch

from trainmem import SetupError, TrainSetup, find_gpu
from trainmem.estimator.breakdown import Breakdown
from trainmem.hardware.cuda import derived_context, sdpa_kernel
from trainmem.hardware.gpus import CATALOG, gpu_problem

MiB, GiB = 2**20, 2**30


def test_cublas_workspace_follows_pytorchs_default_per_architecture():
    # CublasHandlePool.cpp: 4096 * 8 * 1024 on sm90, else 4096 * 1024 * 2 + 16 * 1024 * 8
    assert CATALOG["H200"].cublas_workspace == CATALOG["H100-80GB"].cublas_workspace == 33_554_432
    for name in ("T4", "V100-16GB", "A100-80GB", "L4", "RTX-4090", "RTX-5090"):
        assert CATALOG[name].cublas_workspace == 8_519_680, name


def test_bf16_and_sdpa_kernels_per_architecture():
    t4, v100, a100, h200 = (CATALOG[n] for n in ("T4", "V100-32GB", "A100-40GB", "H200"))
    assert (t4.sm, t4.architecture, t4.bf16, t4.flash) == ((7, 5), "Turing", False, False)
    assert (v100.sm, v100.bf16, v100.flash) == ((7, 0), False, False)
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    assert [sdpa_kernel(d, False, None, t4.flash) for d in dtypes] == ["efficient", "efficient", "efficient"]
    assert [sdpa_kernel(d, False, None, a100.flash) for d in dtypes] == ["flash", "flash", "efficient"]
    assert sdpa_kernel(torch.float16, True, None, t4.flash) == "math"  # no grouped heads without flash
    assert h200.bf16 and h200.flash and CATALOG["RTX-5090"].flash  # sm120 is inside flash's [sm80, sm121]


def test_blackwell_compute_capabilities_get_blackwells_runtime():
    """sm100 (B200), sm103 (B300) and sm120 (RTX 50xx, RTX PRO 6000): flash inside PyTorch's [sm80, sm121], bf16,
    torch 2.11's default cuBLAS workspace (32 MiB is sm90's alone there), and their own threads per SM."""
    from trainmem.hardware import cuda
    from trainmem.hardware.gpus import GPU

    for sm in ((10, 0), (10, 3), (12, 0), (12, 1)):
        card = GPU("x", 100 * GiB, sm=sm)
        assert (card.architecture, card.bf16, card.flash) == ("Blackwell", True, True), sm
        assert cuda.workspace_config(sm) == ":4096:2:16:8" and card.cublas_workspace == 8_519_680, sm
    assert not cuda.has_flash((13, 0)) and GPU("x", GiB, sm=(13, 0)).architecture == (
        "an architecture this catalog does not name")
    assert cuda.workspace_config((9, 0)) == ":4096:8"
    # 263 MiB of the H200's context + SMs x threads per SM x 1 KiB of stack + 224 MiB of kernels
    assert derived_context((10, 0), 148) == derived_context((10, 3), 148) == (
        275_578_880 + 148 * 2048 * 1024 + 235_077_632)
    assert derived_context((12, 0), 188) == 275_578_880 + 188 * 1536 * 1024 + 235_077_632 == 806_354_944


def test_context_measured_on_the_h200_derived_elsewhere():
    h200, t4 = CATALOG["H200"], CATALOG["T4"]
    assert h200.measured and h200.context == 751 * MiB
    # 527 MiB context - 132 SMs x 2048 threads x 1 KiB + 40 x 1024 x 1 KiB + 224 MiB lazily loaded kernels
    assert not t4.measured and t4.context == 552_402_944 - 276_824_064 + 41_943_040 + 235_077_632 == 552_599_552
    # the fused-attention kernels count where SDPA runs on half-precision activations
    assert t4.overhead("sdpa", "fp16", "none") == t4.context + 16 * MiB
    assert t4.overhead("eager", "fp16", "none") == t4.overhead("sdpa", "fp16", "qlora") == t4.context


def test_every_figure_has_a_source():
    for gpu in CATALOG.values():
        sources = gpu.sources()
        assert set(sources) == {"capacity", "context", "compute capability", "cuBLAS workspace", "SDPA kernels", "bf16"}
        assert all(sources.values()), gpu.name
        assert gpu.sms > 0 and gpu.capacity > gpu.context > 0
    assert "github.com/TrajectoryCrafter" in CATALOG["RTX-5090"].source
    assert "derived from the H200" in CATALOG["T4"].sources()["context"]


# name: (capacity in bytes, compute capability, SMs, a piece of the capacity's source, dense half TFLOPS, GB/s)
NEW_CARDS = {
    "RTX-5080": (int(15.47 * GiB), (12, 0), 84, "15.47 GiB", 112.6, 960),
    "RTX-6000-Ada": (int(44.43 * GiB), (8, 9), 142, "github.com/DINGYANB/MTVCrafter/issues/21", 364.2, 960),
    "RTX-PRO-6000": (int(94.97 * GiB), (12, 0), 188, "github.com/antirez/ds4/issues/431", 503.8, 1792),
    "L40": (int(44.40 * GiB), (8, 9), 142, "github.com/QwenLM/Qwen3-VL/issues/2097", 181.05, 864),
    "H100-PCIe": (int(79.11 * GiB), (9, 0), 114, "taken as the H100-80GB's", 756.5, 2000),
    "H100-NVL": (int(93.00 * GiB), (9, 0), 132, "github.com/ali-vilab/VACE/issues/56", 835.5, 3900),
    "H200-NVL": (150_109_880_320, (9, 0), 132, "taken as the H200's measured", 835.5, 4800),
    "B200": (int(178.35 * GiB), (10, 0), 148, "178.35 GiB", 2250, 8000),
    "B300": (int(267.69 * GiB), (10, 3), 148, "267.69 GiB", 2250, 8000),
}


@pytest.mark.parametrize("name", NEW_CARDS)
def test_the_cards_of_2026(name):
    """Each new card's figures, its sources, and its runtime computed from its compute capability and SMs."""
    from trainmem.hardware.gpus import SPEEDS

    capacity, sm, sms, source, half, bandwidth = NEW_CARDS[name]
    card = CATALOG[name]
    assert (card.capacity, card.sm, card.sms) == (capacity, sm, sms)
    assert source in card.source and all(card.sources().values()) and not card.measured
    assert card.context == derived_context(sm, sms) and "derived from the H200" in card.context_source
    assert card.flash and card.bf16
    assert card.cublas_workspace == (33_554_432 if sm == (9, 0) else 8_519_680)
    speed = SPEEDS[name]
    assert (speed.half_tflops, speed.bandwidth_gbs) == (half, bandwidth) and speed.source.startswith("NVIDIA")


def test_runtime_figures_of_the_new_cards_are_computed():
    b200, pro, h100_pcie = CATALOG["B200"], CATALOG["RTX-PRO-6000"], CATALOG["H100-PCIe"]
    # 263 MiB of the H200's context + SMs x threads per SM x 1 KiB of stack + 224 MiB of kernels
    assert b200.context == 275_578_880 + 148 * 2048 * 1024 + 235_077_632 == 821_035_008
    assert pro.context == 806_354_944 and h100_pcie.context == 275_578_880 + 114 * 2048 * 1024 + 235_077_632
    assert CATALOG["H200-NVL"].context == CATALOG["H200"].context == 751 * MiB  # 132 SMs on sm90: the H200's
    assert (b200.architecture, CATALOG["B300"].architecture, pro.architecture) == ("Blackwell",) * 3
    assert CATALOG["RTX-6000-Ada"].architecture == CATALOG["L40"].architecture == "Ada"
    assert "multiProcessorCount" in b200.sources()["compute capability"]


@pytest.mark.parametrize("name,card", [
    ("4090", "RTX-4090"), ("rtx4090", "RTX-4090"), ("RTX-4090", "RTX-4090"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("h100", "H100-80GB"), ("l4", "L4"), ("Tesla T4", "T4"), ("t4", "T4"), ("A100_80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("3060", "RTX-3060-12GB"), ("rtx a6000", "A6000"), ("l40s", "L40S"),
    ("5090", "RTX-5090"), ("a4000", "A4000"), ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-80GB"),
    # a memory size however it is written: 80G, 80GB, 80 GiB
    ("A100-80G", "A100-80GB"), ("a100 80gb", "A100-80GB"), ("A100 80 GiB", "A100-80GB"), ("a100_40g", "A100-40GB"),
    ("Tesla V100 32G", "V100-32GB"), ("RTX 3060 12G", "RTX-3060-12GB"), ("NVIDIA H100 80G HBM3", "H100-80GB"),
    # the cards of 2026, and the names torch.cuda gives them
    ("H100 PCIe", "H100-PCIe"), ("h100-pcie", "H100-PCIe"), ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("H100-PCIE-80GB", "H100-PCIe"), ("H100 NVL", "H100-NVL"), ("nvidia h100 nvl 94g", "H100-NVL"),
    ("NVIDIA H200 NVL", "H200-NVL"), ("h200nvl", "H200-NVL"), ("l40", "L40"), ("NVIDIA L40", "L40"),
    ("NVIDIA L40S", "L40S"), ("rtx pro 6000", "RTX-PRO-6000"), ("RTX PRO 6000 Blackwell", "RTX-PRO-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"), ("6000 ada", "RTX-6000-Ada"),
    ("RTX 6000 Ada", "RTX-6000-Ada"), ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"), ("5080", "RTX-5080"),
    ("rtx5080", "RTX-5080"), ("NVIDIA GeForce RTX 5080", "RTX-5080"), ("NVIDIA GeForce RTX 5090", "RTX-5090"),
    ("NVIDIA B200", "B200"), ("b200", "B200"), ("NVIDIA B300 SXM6 AC", "B300"), ("B300", "B300"),
    ("NVIDIA H100", "H100-80GB"),  # an H100 said without its form factor is the SXM card, as before
])
def test_cards_as_users_name_them(name, card):
    assert find_gpu(name) is CATALOG[card]
    assert gpu_problem(name) is None


def test_ambiguous_and_unknown_names():
    assert find_gpu("a100") is None
    assert gpu_problem("A100") == "--gpu: 'A100' comes with different memory sizes: pass A100-40GB or A100-80GB"
    assert "V100-16GB or V100-32GB" in gpu_problem("v100")
    unknown = gpu_problem("T5")
    assert unknown.startswith("--gpu: unknown card 'T5'; known: T4, V100-16GB") and "RTX-5090" in unknown
    assert "\n" not in unknown


@pytest.mark.parametrize("name,suggested", [
    ("3090ti", "RTX-3090"), ("RTX 3090 Ti", "RTX-3090"), ("NVIDIA GeForce RTX 3090 Ti", "RTX-3090"),
    ("h100 sxm5", "H100-80GB"), ("rtx 4090 d", "RTX-4090"), ("4070", "RTX-4080 or RTX-4090"),
    ("H100 PCI", "H100-PCIe"), ("H200 NV", "H200-NVL"), ("5070", "RTX-5080 or RTX-5090"),
    # the 300 W Max-Q runs slower than the 600 W card the record's speeds are: asked, not matched
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000"),
])
def test_a_near_miss_asks_did_you_mean_instead_of_listing_the_catalog(name, suggested):
    """A name close to a catalog name (difflib) is not taken for that card: the one-line error names it."""
    assert find_gpu(name) is None
    assert gpu_problem(name) == (f"--gpu: unknown card {name!r}; did you mean {suggested}? "
                                 "(or cap by bytes with --memory-cap)")


def test_a_6000_alone_names_several_cards():
    for name in ("6000", "RTX 6000", "Quadro RTX 6000"):
        assert find_gpu(name) is None
        assert gpu_problem(name) == (
            f"--gpu: {name!r} names several cards (the Turing Quadro RTX 6000 is not in the catalog: cap it with "
            "--memory-cap): pass RTX-6000-Ada or RTX-PRO-6000 or A6000")


def test_names_far_from_every_card_still_list_the_catalog():
    for name in ("T5", "", "[bold]T4", "MI300X"):
        assert f"; known: {', '.join(CATALOG)} (" in gpu_problem(name), name


def test_bf16_on_a_card_without_it_is_a_setup_problem_reported_with_the_others():
    with pytest.raises(SetupError) as e:
        TrainSetup(precision="bf16", gpu="T4", batch_size=0).validate()
    assert e.value.problems == [
        "--batch-size: must be a whole number >= 1, got 0",
        "--precision bf16: the T4 (sm75, Turing) has no native bf16; use --precision amp-fp16 (fp32 weights, "
        "fp16 autocast with a gradient scaler)"]
    assert "the V100-16GB (sm70, Volta)" in TrainSetup(precision="amp-bf16", gpu="v100-16gb").problems()[0]
    assert TrainSetup(precision="fp16", gpu="T4").problems() == []
    assert TrainSetup(precision="amp-fp16", gpu="T4").problems() == []
    assert TrainSetup(precision="bf16", gpu="A100-40GB").problems() == []


def test_auto_precision_of_a_bf16_checkpoint_on_a_t4_is_refused():
    from trainmem import ModelSpec

    spec = ModelSpec.resolve("llama-3.2-1b")
    problems = TrainSetup(gpu="T4").problems(spec)
    assert problems == ["--precision auto (the llama-3.2-1b checkpoint is bf16): the T4 (sm75, Turing) has no native "
                        "bf16; use --precision amp-fp16 (fp32 weights, fp16 autocast with a gradient scaler)"]
    assert TrainSetup(gpu="T4", device="cpu").problems(spec) == []  # fp32 on the CPU


def _breakdown(reserved: int, terms: dict | None = None) -> Breakdown:
    memory = {"weights": 1, "gradients": 0, "optimizer": 0, "activations": 5, "other": 0, "peak_allocated": 6,
              "peak_reserved": reserved, "device_used": 0}
    setup = {**TrainSetup(precision="fp16", attention="sdpa").to_dict(), "device": "cuda"}
    return Breakdown("simulate", memory, {}, "forward/backward", setup, {}, 0, terms or {})


def test_three_valued_verdict():
    t4 = CATALOG["T4"]
    overhead = t4.context + 16 * MiB
    budget = int(t4.capacity * 0.98)
    edge = budget - overhead  # reserved that leaves exactly the margin
    v = _breakdown(edge).verdict("T4")
    assert (v["level"], v["fits"], v["headroom"]) == ("fits", True, 0)
    v = _breakdown(edge + 1).verdict("T4")
    assert (v["level"], v["fits"], v["headroom"]) == ("tight", False, -1)
    assert _breakdown(t4.capacity - overhead).verdict("T4")["level"] == "tight"
    v = _breakdown(t4.capacity - overhead + 1).verdict("T4")
    assert (v["level"], v["fits"], v["cut_first"], v["need"]) == ("no", False, "activations", t4.capacity + 1)


def test_the_verdict_says_where_the_methods_disagree():
    t4 = CATALOG["T4"]
    overhead = t4.context + 16 * MiB
    b = _breakdown(t4.capacity - overhead, {"analytic_reserved": 10 * GiB})
    v = b.verdict("T4")
    assert v["methods"] == {"simulate": "tight", "analytic": "fits"} and v["disagree"] is True
    assert b.disagreement("T4").startswith("the methods disagree on the T4: simulate says tight")
    assert b.disagreement("T4") in b.to_result("T4").notes
    agree = _breakdown(10 * GiB, {"analytic_reserved": 10 * GiB})
    assert agree.verdict("T4")["disagree"] is False and agree.disagreement("T4") is None


def test_the_verdict_line_says_the_level():
    from trainmem.output.render import verdict_line

    t4 = CATALOG["T4"]
    tight = _breakdown(t4.capacity - t4.context - 16 * MiB).verdict("T4")
    line = verdict_line(tight)
    assert line.startswith("T4: [yellow]tight[/yellow] (fits the capacity, with less than the margin free), headroom -")
    assert tight["runtime"] == "H200" and "modelled on the H200: pass --gpu T4" in line  # no gpu in its setup
    on_t4 = Breakdown("analytic", _breakdown(0).memory, {}, "optimizer step",
                      {**TrainSetup(precision="fp16", gpu="T4").to_dict(), "device": "cuda"}, {}, 0)
    assert on_t4.verdict("t4")["runtime"] == "T4" and "modelled" not in verdict_line(on_t4.verdict("T4"))
    old = {"gpu": "T4", "fits": False, "headroom": -GiB, "margin": 0.02, "advice": "x"}  # a row from before levels
    assert verdict_line(old).startswith("T4: [red]does not fit[/red], headroom -1.000 GiB")


@pytest.mark.slow  # the chapter's seven setups simulated: a minute and more
def test_the_chapters_t4_rows():
    """The book's outcomes on its T4: everything but batch 16 fits (or is tight, with the reason), batch 16
    does not, by both methods (simulate carries the analytic reserved bytes along)."""
    from trainmem.config.chapter import MODEL, RUNS
    from trainmem.estimator import estimate

    levels, notes = {}, {}
    for run in RUNS:
        b = estimate(MODEL, run.setup.replace(gpu="T4"), "simulate")
        v = b.verdict("T4")
        assert b.method == "simulate" and b.terms["cublas_workspace"] == 2 * 8_519_680
        assert b.device_overhead == CATALOG["T4"].overhead("sdpa", "fp16", run.setup.peft)
        levels[run.label] = (v["methods"]["simulate"], v["methods"]["analytic"])
        # the analytic level the verdict carries is `--method analytic`'s own
        a = estimate(MODEL, run.setup.replace(gpu="T4"), "analytic")
        assert a.memory["peak_reserved"] == b.terms["analytic_reserved"]
        assert a.verdict("T4")["level"] == v["methods"]["analytic"]
        notes[run.label] = b.to_result("T4").notes
    assert levels == {
        "batch 4": ("fits", "fits"), "batch 8": ("fits", "fits"), "batch 16": ("no", "no"),
        "batch 4, accumulation 4": ("fits", "fits"), "batch 16, checkpointing": ("fits", "fits"),
        "batch 16, LoRA": ("fits", "fits"), "batch 16, QLoRA": ("fits", "fits")}
    # where the levels agree the result says nothing of a disagreement (test_the_verdict_says_where_the_
    # methods_disagree covers the other case)
    assert not any(n.startswith("the methods disagree") for run_notes in notes.values() for n in run_notes)


def test_gpu_left_out_means_this_card(monkeypatch):
    # no CUDA here: stand in for torch.cuda's answers, as a T4 and as a card the catalog does not name
    import types

    import torch

    from trainmem.hardware import gpus

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    t4 = types.SimpleNamespace(name="Tesla T4", total_memory=gpus.find_gpu("T4").capacity, major=7, minor=5,
                               multi_processor_count=40)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: t4)
    assert gpus.this_card() == "T4"
    sxm = types.SimpleNamespace(name="NVIDIA A100-SXM4-80GB", total_memory=85_100_000_000, major=8, minor=0,
                                multi_processor_count=108)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: sxm)
    assert gpus.this_card() == "A100-80GB"  # the catalog's card, within a quarter GiB of its capacity
    a2000 = types.SimpleNamespace(name="NVIDIA RTX A2000 12GB", total_memory=12_622_168_064, major=8, minor=6,
                                  multi_processor_count=26)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: a2000)
    monkeypatch.setattr(gpus, "CATALOG", dict(gpus.CATALOG))
    monkeypatch.setattr(gpus, "_INDEX", dict(gpus._INDEX))
    name = gpus.this_card()
    card = gpus.find_gpu(name)
    assert name == "NVIDIA RTX A2000 12GB" and card.capacity == 12_622_168_064 and card.bf16 and card.flash
    assert card.context == derived_context((8, 6), 26)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus.this_card() is None


def test_kernels_that_read_the_sm_count_group_cards_by_it_too():
    """Liger's RMSNorm keeps a partial row per SM and flash-attn splits by SMs: their simulated step differs
    between an A10G (80 SMs) and an A100 (108) of one cuBLAS workspace and flash kernel; plain SDPA's does not."""
    from trainmem import ModelSpec
    from trainmem.search.cards import groups

    spec = ModelSpec.resolve("tiny-llama")
    cards = ["A10G", "A100-40GB", "RTX-4090"]
    plain = TrainSetup(precision="bf16")
    assert [[c.name for c in g] for g in groups(spec, plain, cards)] == [cards]
    for setup in (plain.replace(kernels="liger"), plain.replace(attention="flash_attention_2")):
        assert [[c.name for c in g] for g in groups(spec, setup, cards)] == [[c] for c in cards]
