"""A catalog of GPUs: what a training process can really use on each, and what that card's runtime
does differently (kernels, cuBLAS workspace, bf16), every figure with its source (docs/cards.md).

`capacity` is the total that PyTorch reports on that card (`torch.cuda.get_device_properties().total_memory`,
the "total capacity" in its OOM messages), which is already less than the marketing size (ECC, driver
reserve). `context` is what the CUDA context and the kernels loaded during a training step take outside
the PyTorch allocator on that card, at the peak. Only the H200's is measured; the others are derived from
it (`derived_context`): the part of a context that scales with the card (local memory for every thread the
card can hold) is recomputed, the rest is taken as measured on the H200.

`--gpu NAME` caps the caching allocator at `capacity - context`, so that a bigger card reproduces a
smaller card's OOM, and makes `estimate` model that card's kernels and workspaces.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from . import cuda
from .cuda import H200_OVERHEAD, THREADS_PER_SM, derived_context

MiB, GiB = 1024**2, 1024**3

ARCHITECTURES = {7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}
"""Architecture by compute-capability major: Blackwell is sm100/sm103 in the data center (B200, B300), sm110
(Thor) and sm120/sm121 in workstations and GeForce (RTX PRO 6000, RTX 50xx; DGX Spark)."""

_DEFAULT_CAPACITY_SOURCE = "total capacity in PyTorch OOM messages reported by users of this card (link not recorded)"


@dataclass(frozen=True)
class GPU:
    """A card as the estimate and the verdict see it: capacity, memory outside the allocator, cuBLAS workspace,
    attention kernels, each with its source."""
    name: str
    capacity: int
    """Bytes PyTorch reports as the card's total memory."""
    context: int = int(0.4 * GiB)
    """Bytes outside the allocator at the peak: CUDA context and lazily loaded kernels (no fused-attention
    kernels; `overhead` adds those). Measured on the H200, derived elsewhere (`derived_context`)."""
    source: str = _DEFAULT_CAPACITY_SOURCE
    """Where `capacity` comes from."""
    sm: tuple[int, int] = (9, 0)
    """Compute capability."""
    sms: int = 0
    """Streaming multiprocessors (the vendor's datasheet or whitepaper)."""
    aliases: tuple[str, ...] = ()
    """Other names users give this card (matched without case and punctuation)."""
    context_source: str = "estimate (0.4 GiB)"
    measured: bool = False
    """The runtime figures were measured on this card (else derived from the H200's)."""
    sms_source: str = "NVIDIA datasheet"
    """Where `sm` and `sms` come from."""

    def budget(self, margin: float) -> int:
        """Bytes a run may need on this card (peak reserved + context) and still count as fitting,
        keeping `margin` (a fraction of capacity) free: the one rule for estimates and real runs."""
        return int(self.capacity * (1 - margin))

    @property
    def architecture(self) -> str:
        """The architecture's name for the compute capability (Turing, Ampere, Hopper, ...), for messages."""
        if self.sm in ((7, 5), (8, 9)):
            return "Turing" if self.sm == (7, 5) else "Ada"
        return ARCHITECTURES.get(self.sm[0], "an architecture this catalog does not name")

    @property
    def bf16(self) -> bool:
        """Native bf16 arithmetic (sm80+): T4 and V100 have none, so bf16 training there fails."""
        return self.sm >= (8, 0)

    @property
    def flash(self) -> bool:
        """PyTorch's flash-attention SDPA kernel runs here; which kernel a call gets is `cuda.sdpa_kernel`'s choice."""
        return cuda.has_flash(self.sm)

    @property
    def cublas_workspace(self) -> int:
        """Bytes of the workspace PyTorch allocates for each cuBLAS handle by default (`cuda.cublas_workspace`)."""
        return cuda.cublas_workspace(self.sm)

    def overhead(self, attention: str, precision: str, peft: str) -> int:
        """Bytes outside the allocator at the peak of a step of this setup: `context`, plus the fused-attention
        kernels where the step loads them (`cuda.fused_attention_loaded`)."""
        fused = cuda.fused_attention_loaded(attention, precision, peft)
        return self.context + (cuda.FUSED_ATTENTION_KERNELS if fused else 0)

    def allocator_cap(self, attention: str, precision: str, peft: str) -> int:
        """Bytes the caching allocator may reserve on this card for a step of this setup: capacity less
        what the setup has outside the allocator (`overhead`). The one cap for the estimate's allocator
        replay and for `run --gpu` on a bigger card, so that a step that reaches it is judged as the
        capacity exactly (`tight`), not as the cap plus memory the allocator could never have had."""
        return self.capacity - self.overhead(attention, precision, peft)

    def sources(self) -> dict[str, str]:
        """Each figure of this record and where it comes from."""
        return {"capacity": self.source, "context": self.context_source,
                "compute capability": f"sm{self.sm[0]}{self.sm[1]}, {self.sms} SMs ({self.sms_source})",
                "cuBLAS workspace": cuda.CUBLAS_SOURCE, "SDPA kernels": cuda.SDPA_SOURCE,
                "bf16": "native from sm80 (Ampere); sm70/sm75 have no bf16 tensor cores"}


def _gib(x: float) -> int:
    return int(x * GiB)


def _card(name: str, capacity: int, sm: tuple[int, int], sms: int, source: str = _DEFAULT_CAPACITY_SOURCE,
          aliases: tuple[str, ...] = (), sms_source: str = "NVIDIA datasheet") -> GPU:
    return GPU(name, capacity, derived_context(sm, sms), source, sm, sms, aliases,
               context_source=f"derived from the H200 measurement for {sms} SMs x {THREADS_PER_SM[sm]} threads "
                              "(see gpus.derived_context); not measured on this card", sms_source=sms_source)


def _oom(url: str, text: str) -> str:
    return f"PyTorch OOM message '{text}', {url}"


def _unlinked(text: str, where: str) -> str:
    return f"PyTorch OOM message '{text}' in {where} (link not recorded)"


_H200_BYTES = 150_109_880_320
"""The H200's total_memory, measured (docs/lab/run-chapter-h200.md)."""
_BLACKWELL_SMS = "cudaDeviceProp.multiProcessorCount users report; NVIDIA's datasheets give no SM count"


CATALOG: dict[str, GPU] = {g.name: g for g in [
    _card("T4", _gib(14.75), (7, 5), 40, aliases=("Tesla T4",)),
    _card("V100-16GB", _gib(15.77), (7, 0), 80, aliases=("V100 16GB", "Tesla V100 16GB")),
    _card("V100-32GB", _gib(31.74), (7, 0), 80, aliases=("V100 32GB", "Tesla V100 32GB")),
    _card("L4", _gib(22.03), (8, 9), 58),
    _card("A10G", _gib(22.19), (8, 6), 80),
    _card("RTX-3060-12GB", _gib(11.75), (8, 6), 28,
          _oom("https://github.com/Kunhao-Liu/StyleGaussian/issues/12", "11.75 GiB total capacity"),
          aliases=("3060", "RTX 3060", "GeForce RTX 3060")),
    _card("RTX-3090", _gib(23.69), (8, 6), 82, aliases=("3090", "GeForce RTX 3090")),
    _card("RTX-4080", _gib(15.99), (8, 9), 76,
          _oom("https://github.com/aigc-apps/sd-webui-EasyPhoto/issues/281", "15.99 GiB total capacity"),
          aliases=("4080", "GeForce RTX 4080")),
    _card("RTX-4090", _gib(23.64), (8, 9), 128,
          _oom("https://github.com/ali-vilab/VGen/issues/104", "total capacity of 23.64 GiB"),
          aliases=("4090", "GeForce RTX 4090")),
    _card("RTX-5080", _gib(15.47), (12, 0), 84,
          _unlinked("GPU 0 has a total capacity of 15.47 GiB", "a public vLLM speculative-decoding log on an RTX 5080"),
          aliases=("5080", "GeForce RTX 5080"), sms_source="NVIDIA RTX Blackwell GPU architecture whitepaper"),
    _card("RTX-5090", _gib(31.36), (12, 0), 170,
          _oom("https://github.com/TrajectoryCrafter/TrajectoryCrafter/issues/20", "total capacity of 31.36 GiB"),
          aliases=("5090", "GeForce RTX 5090")),
    _card("A4000", _gib(15.61), (8, 6), 48,
          _oom("https://github.com/DengKaiCQ/VGGT-Long/issues/6", "total capacity of 15.61 GiB"),
          aliases=("RTX A4000",)),
    _card("A5000", _gib(23.67), (8, 6), 64,
          _oom("https://github.com/Magicboomliu/Accelerator-Simple-Template/issues/7", "23.67 GiB total capacity"),
          aliases=("RTX A5000",)),
    _card("A6000", _gib(47.54), (8, 6), 84, aliases=("RTX A6000",)),
    # with ECC on (46068 MiB in nvidia-smi), as in the report; with ECC off the card has 49140 MiB, ~3 GiB more
    _card("RTX-6000-Ada", _gib(44.43), (8, 9), 142,
          _oom("https://github.com/DINGYANB/MTVCrafter/issues/21", "GPU 0 has a total capacity of 44.43 GiB")
          + " (NVIDIA RTX 6000 Ada Generation, 46068 MiB in nvidia-smi: ECC on; ECC off shows 49140 MiB)",
          aliases=("RTX 6000 Ada", "RTX 6000 Ada Generation")),
    # the same GB202 board in the Workstation (600 W) and Server Editions; the 300 W Max-Q is left unmatched
    _card("RTX-PRO-6000", _gib(94.97), (12, 0), 188,
          "CUDA's total for the card, 'total=94.97 GiB' (what PyTorch's OOM message reports as total capacity) on an "
          "RTX PRO 6000 Blackwell of 97887 MiB, https://github.com/antirez/ds4/issues/431",
          aliases=("RTX PRO 6000", "RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell Workstation Edition",
                   "RTX PRO 6000 Blackwell Server Edition"),
          sms_source="NVIDIA RTX PRO Blackwell GPU architecture whitepaper (188 of GB202's 192 SMs)"),
    _card("L40", _gib(44.40), (8, 9), 142,
          _oom("https://github.com/QwenLM/Qwen3-VL/issues/2097", "GPU 0 has a total capacity of 44.40 GiB")),
    _card("L40S", _gib(44.53), (8, 9), 142),
    _card("A100-40GB", _gib(39.39), (8, 0), 108, aliases=("A100 40GB", "A100-SXM4-40GB", "A100-PCIE-40GB")),
    _card("A100-80GB", _gib(79.15), (8, 0), 108, aliases=("A100 80GB", "A100-SXM4-80GB", "A100-PCIE-80GB")),
    # the same 80 GB as the SXM card below (HBM2e): its capacity taken
    _card("H100-PCIe", _gib(79.11), (9, 0), 114,
          "taken as the H100-80GB's (both 80 GB; 'total capacity of 79.11 GiB'), not seen in an OOM message of an "
          "H100 PCIe", aliases=("H100 PCIe", "H100 PCIe 80GB", "H100-PCIE-80GB"),
          sms_source="NVIDIA H100 Tensor Core GPU architecture whitepaper: 114 SMs on the PCIe card"),
    # "NVIDIA H100 80GB HBM3": the name torch.cuda reports for the H100 SXM (seen on the one measured here)
    _card("H100-80GB", _gib(79.11), (9, 0), 132, aliases=("H100", "H100 SXM", "H100-SXM5-80GB", "H100 80GB HBM3")),
    _card("H100-NVL", _gib(93.00), (9, 0), 132,
          _oom("https://github.com/ali-vilab/VACE/issues/56", "GPU 0 has a total capacity of 93.00 GiB")
          + " (a comment on an H100 NVL 94GB)", aliases=("H100 NVL", "H100 NVL 94GB")),
    # measured on the H200 used for docs/ (2026-12-02/03): total_memory, context, overhead at the peak
    GPU("H200", _H200_BYTES, H200_OVERHEAD, "measured H200 2026-12-02, docs/lab/run-chapter-h200.md", (9, 0), 132,
        ("H200 141GB",), context_source="measured H200 2026-12-03: 527 MiB context at start + 224 MiB kernels "
        "loaded during the first step (docs/lab/estimate-validation.md)", measured=True),
    _card("H200-NVL", _H200_BYTES, (9, 0), 132,
          "taken as the H200's measured total_memory (both 141 GB HBM3e), not seen on an H200 NVL",
          aliases=("H200 NVL", "H200 NVL 141GB")),
    _card("B200", _gib(178.35), (10, 0), 148,
          _unlinked("GPU 0 has a total capacity of 178.35 GiB", "public logs of 8xB200 training and serving runs")
          + " (178.36 GiB in another)", aliases=("B200 SXM", "B200 180GB"), sms_source=_BLACKWELL_SMS),
    # "NVIDIA B300 SXM6 AC" (275040 MiB in nvidia-smi: one of 16 memory controllers fused off); a B300 with all
    # 16 has more, so this capacity errs towards tight there
    _card("B300", _gib(267.69), (10, 3), 148,
          _unlinked("GPU 0 has a total capacity of 267.69 GiB", "three public training and serving logs on the "
                    "B300 SXM6 AC (275040 MiB in nvidia-smi)"),
          aliases=("B300 SXM6 AC", "B300 SXM", "B300 288GB"), sms_source=_BLACKWELL_SMS),
]}

_SIZES = "comes with different memory sizes"
_SIXES = (("RTX-6000-Ada", "RTX-PRO-6000", "A6000"),
          "names several cards (the Turing Quadro RTX 6000 is not in the catalog: cap it with --memory-cap)")
AMBIGUOUS: dict[str, tuple[tuple[str, ...], str]] = {
    "a100": (("A100-40GB", "A100-80GB"), _SIZES), "v100": (("V100-16GB", "V100-32GB"), _SIZES),
    "6000": _SIXES, "rtx6000": _SIXES}
"""Names (as `_key` writes them) that fit several cards, with the cards and why: the lookup asks which."""


def _key(name: str) -> str:
    """Case and punctuation dropped, the vendor words users add or leave out, and a memory size written the one
    way (`80G`, `80GB`, `80 GiB`: `80g`)."""
    k = re.sub(r"[^a-z0-9]", "", name.lower())
    for word in ("nvidia", "geforce", "tesla", "quadro"):
        k = k.replace(word, "")
    return re.sub(r"(?<=\d)gi?b", "g", k)


def _index() -> dict[str, GPU]:
    out: dict[str, GPU] = {}
    for gpu in CATALOG.values():
        for n in (gpu.name, *gpu.aliases):
            out[_key(n)] = gpu
            if _key(n).startswith("rtx"):
                out[_key(n)[3:]] = gpu
    return out


_INDEX = _index()


def find_gpu(name: str) -> GPU | None:
    """The card `name` means, without case or punctuation (t4, A100_80GB, rtx4090, RTX-4090, 4090);
    None for an unknown or ambiguous name (`gpu_problem` says which)."""
    return _INDEX.get(_key(name))


NEAR = 0.75
"""How alike (difflib's ratio of the two names as `_key` writes them) an unknown name and a catalog name must be
for the error to ask "did you mean" that card instead of listing the catalog."""


def near_cards(name: str) -> list[str]:
    """The catalog cards whose names (or other names) `name` is a near miss of, best first, at most three: those
    within 0.05 of the best ratio at or above `NEAR` (`3090ti` -> RTX-3090, `H100 PCI` -> H100-PCIe)."""
    key = _key(name)
    best: dict[str, float] = {}
    for k, gpu in _INDEX.items():
        ratio = difflib.SequenceMatcher(None, key, k).ratio() if key else 0.0
        if ratio >= NEAR:
            best[gpu.name] = max(ratio, best.get(gpu.name, 0.0))
    if not best:
        return []
    order = list(CATALOG)
    top = max(best.values())
    near = sorted((n for n, r in best.items() if r >= top - 0.05),
                  key=lambda n: (-best[n], order.index(n) if n in order else len(order)))
    return near[:3]


def gpu_problem(name: str) -> str | None:
    """Why `name` names no card, in one line: ambiguous (with the cards it could be), a near miss ("did you mean"
    the closest card or cards), or unknown (with the catalog); None when it names one."""
    if find_gpu(name) is not None:
        return None
    if _key(name) in AMBIGUOUS:
        options, why = AMBIGUOUS[_key(name)]
        return f"--gpu: {name!r} {why}: pass {' or '.join(options)}"
    near = near_cards(name)
    if near:
        return f"--gpu: unknown card {name!r}; did you mean {' or '.join(near)}? (or cap by bytes with --memory-cap)"
    return f"--gpu: unknown card {name!r}; known: {', '.join(CATALOG)} (or cap by bytes with --memory-cap)"


def margin_problem(margin: float) -> str | None:
    """The headroom kept free on a card is a fraction of its capacity, in [0, 1): else the problem."""
    if 0 <= margin < 1:
        return None
    return f"--margin: expected a fraction in [0, 1), got {margin!r}"


def this_card() -> str | None:
    """The catalog name of this machine's first CUDA card, so that `--gpu` left out means "this card";
    None without CUDA. A card the catalog does not name (or names under another capacity, e.g. an
    A100-SXM4-80GB) gets a record from its own properties: the capacity PyTorch reports, its compute
    capability and SM count, and the memory outside the allocator derived as for the catalog's cards."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    known = find_gpu(props.name)
    if known is not None and abs(known.capacity - props.total_memory) < GiB // 4:
        return known.name
    sm = (props.major, props.minor)
    context = derived_context(sm, props.multi_processor_count) if sm in THREADS_PER_SM else CATALOG["H200"].context
    card = GPU(props.name, props.total_memory, context,
               "this machine (torch.cuda.get_device_properties)", sm, props.multi_processor_count,
               context_source="derived from the H200 measurement for this card's SM count (gpus.derived_context)")
    CATALOG[card.name] = card
    _INDEX[_key(card.name)] = card
    return card.name


# --- speed figures for the step-time model (trainmem.estimator.time.step) -----------------------------------
@dataclass(frozen=True)
class Speed:
    """A card's peak dense throughput and bandwidth, as its vendor publishes them (no sparsity)."""

    half_tflops: float
    """Dense fp16/bf16 tensor-core TFLOPS with fp32 accumulation (what PyTorch's matmuls use)."""
    fp32_tflops: float
    """Plain fp32 (CUDA-core) TFLOPS: PyTorch runs fp32 matmuls without TF32 unless told to
    (`torch.backends.cuda.matmul.allow_tf32` is False by default)."""
    tf32_tflops: float | None
    """Dense TF32 tensor-core TFLOPS (None before Ampere); used only where TF32 is enabled."""
    bandwidth_gbs: float
    """Device memory bandwidth, GB/s (10**9 bytes)."""
    pcie_gbs: float
    """Host link, GB/s per direction (PCIe 3.0 x16 ~16, 4.0 ~32, 5.0 ~64; the SXM cards' host link too)."""
    source: str


_AMPERE_WP = "NVIDIA Ampere GA102 GPU architecture whitepaper v2.1 (2021), appendix table"
_ADA_WP = "NVIDIA Ada GPU architecture whitepaper v2.1 (2023), appendix tables"
SPEEDS: dict[str, Speed] = {
    "T4": Speed(65, 8.1, None, 320, 16,
                "NVIDIA T4 datasheet (tesla-t4-datasheet-951643): 65 TFLOPS mixed FP16/FP32, 8.1 TFLOPS FP32, "
                "320 GB/s, PCIe 3.0 x16"),
    "V100-16GB": Speed(125, 15.7, None, 900, 16,
                       "NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor, 15.7 TFLOPS FP32, 900 GB/s, PCIe 3.0 host"),
    "V100-32GB": Speed(125, 15.7, None, 900, 16,
                       "NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor, 15.7 TFLOPS FP32, 900 GB/s, PCIe 3.0 host"),
    "L4": Speed(121, 30.3, 60, 300, 32,
                "NVIDIA L4 datasheet: FP16/BF16 tensor 242 TFLOPS with sparsity (121 dense), TF32 120 sparse "
                "(60 dense), FP32 30.3, 300 GB/s, PCIe 4.0 x16"),
    "A10G": Speed(125, 31.2, 62.5, 600, 32,
                  "NVIDIA A10 datasheet (A10G is AWS's variant of it, not published separately: A10 figures "
                  "taken): FP16/BF16 tensor 250 sparse (125 dense), TF32 62.5 dense, FP32 31.2, 600 GB/s, PCIe 4.0"),
    "RTX-3060-12GB": Speed(25.5, 12.7, 12.7, 360, 32,
                           _AMPERE_WP + " scaled to the RTX 3060's 28 SMs at 1.78 GHz (GeForce: FP16 tensor with FP32 "
                           "accumulate at half rate), 360 GB/s, PCIe 4.0"),
    "RTX-3090": Speed(71, 35.6, 35.6, 936, 32,
                      _AMPERE_WP + ": RTX 3090 FP16 tensor with FP32 accumulate 71 dense, TF32 35.6, FP32 35.6, 936 GB/s"),
    "RTX-4080": Speed(97.5, 48.7, 48.7, 717, 32,
                      _ADA_WP + ": RTX 4080 FP16 tensor with FP32 accumulate 97.5 dense, FP32 48.7, 716.8 GB/s"),
    "RTX-4090": Speed(165.2, 82.6, 82.6, 1008, 32,
                      _ADA_WP + ": RTX 4090 FP16 tensor with FP32 accumulate 165.2 dense, FP32 82.6, 1008 GB/s"),
    "RTX-5080": Speed(112.6, 56.3, 56.3, 960, 64,
                      "NVIDIA RTX Blackwell GPU architecture whitepaper v1.0 (2025): RTX 5080 FP16 tensor with FP32 "
                      "accumulate 112.6 dense, FP32 56.3, 960 GB/s, PCIe 5.0"),
    "RTX-5090": Speed(209.5, 104.8, 104.8, 1792, 64,
                      "NVIDIA RTX Blackwell GPU architecture whitepaper v1.0 (2025): RTX 5090 FP16 tensor with FP32 "
                      "accumulate 209.5 dense, FP32 104.8, 1792 GB/s, PCIe 5.0"),
    "A4000": Speed(76.7, 19.2, 38.4, 448, 32,
                   "NVIDIA RTX A4000 datasheet: tensor 153.4 TFLOPS with sparsity (76.7 dense), FP32 19.2, 448 GB/s"),
    "A5000": Speed(111.1, 27.8, 55.6, 768, 32,
                   "NVIDIA RTX A5000 datasheet: tensor 222.2 TFLOPS with sparsity (111.1 dense), FP32 27.8, 768 GB/s"),
    "A6000": Speed(154.8, 38.7, 77.4, 768, 32,
                   "NVIDIA RTX A6000 datasheet: tensor 309.7 TFLOPS with sparsity (154.8 dense), FP32 38.7, 768 GB/s"),
    "RTX-6000-Ada": Speed(364.2, 91.1, 182.1, 960, 32,
                          "NVIDIA RTX 6000 Ada Generation datasheet: FP32 91.1, 1,457 AI TOPS (FP8 with sparsity), "
                          "960 GB/s, PCIe 4.0 x16; FP16/BF16 tensor with FP32 accumulate 364.2 dense and TF32 182.1 "
                          "dense derived from it (1,457 / 4; RTX pro cards accumulate in FP32 at full rate)"),
    "RTX-PRO-6000": Speed(503.8, 125, 251.9, 1792, 64,
                          "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet: FP32 125, 4,000 AI TOPS (FP4 "
                          "with sparsity), 1792 GB/s, PCIe 5.0 x16; FP16/BF16 tensor with FP32 accumulate 503.8 dense "
                          "and TF32 251.9 dense derived (188 SMs x 4 tensor cores at the 2617 MHz boost, "
                          "full-rate FP32 accumulate as on RTX pro cards; 4,000 / 8 = 500)"),
    "L40": Speed(181.05, 90.5, 90.5, 864, 32,
                 "NVIDIA L40 datasheet: BF16/FP16 tensor 362.1 TFLOPS with sparsity (181.05 dense), TF32 181 sparse "
                 "(90.5 dense), FP32 90.5, 864 GB/s, PCIe 4.0 x16"),
    "L40S": Speed(362, 91.6, 183, 864, 32,
                  "NVIDIA L40S datasheet: BF16/FP16 tensor 733 TFLOPS with sparsity (362 dense), TF32 183 dense, "
                  "FP32 91.6, 864 GB/s, PCIe 4.0"),
    "A100-40GB": Speed(312, 19.5, 156, 1555, 32,
                       "NVIDIA A100 datasheet (SXM4 40GB): BF16/FP16 tensor 312, TF32 156, FP32 19.5, 1555 GB/s, PCIe 4.0"),
    "A100-80GB": Speed(312, 19.5, 156, 2039, 32,
                       "NVIDIA A100 datasheet (SXM4 80GB): BF16/FP16 tensor 312, TF32 156, FP32 19.5, 2039 GB/s, PCIe 4.0"),
    "H100-PCIe": Speed(756.5, 51, 378, 2000, 64,
                       "NVIDIA H100 datasheet (PCIe): BF16/FP16 tensor 1,513 with sparsity (756.5 dense), TF32 756 "
                       "sparse (378 dense), FP32 51, 2 TB/s, PCIe 5.0"),
    "H100-80GB": Speed(989, 67, 494.5, 3350, 64,
                       "NVIDIA H100 datasheet (SXM): BF16/FP16 tensor 1979 with sparsity (989 dense), TF32 494.5 dense, "
                       "FP32 67, 3.35 TB/s, PCIe 5.0"),
    "H100-NVL": Speed(835.5, 60, 417.5, 3900, 64,
                      "NVIDIA H100 datasheet (H100 NVL): BF16/FP16 tensor 1,671 with sparsity (835.5 dense), TF32 835 "
                      "sparse (417.5 dense), FP32 60, 3.9 TB/s, PCIe 5.0"),
    "H200": Speed(989, 67, 494.5, 4800, 64,
                  "NVIDIA H200 datasheet (SXM): BF16/FP16 tensor 1979 with sparsity (989 dense), TF32 494.5 dense, "
                  "FP32 67, 4.8 TB/s, PCIe 5.0"),
    "H200-NVL": Speed(835.5, 60, 417.5, 4800, 64,
                      "NVIDIA H200 datasheet (H200 NVL): BF16/FP16 tensor 1,671 with sparsity (835.5 dense), TF32 835 "
                      "sparse (417.5 dense), FP32 60, 4.8 TB/s, PCIe 5.0"),
    "B200": Speed(2250, 75, 1125, 8000, 64,
                  "NVIDIA HGX B200 datasheet, the 8-GPU board's figures / 8: FP16/BF16 tensor 36 PFLOPS with sparsity "
                  "(2,250 dense a GPU), TF32 18 PFLOPS sparse (1,125 dense), FP32 600 TFLOPS (75), 8 TB/s a GPU; the "
                  "host link at PCIe 5.0, the HGX hosts' (the GPU's own is PCIe 6.0)"),
    "B300": Speed(2250, 75, 1125, 8000, 64,
                  "NVIDIA HGX B300 datasheet, the 8-GPU board's figures / 8: FP16/BF16 tensor 36 PFLOPS with sparsity "
                  "(2,250 dense a GPU), TF32 18 PFLOPS sparse (1,125 dense), FP32 600 TFLOPS (75), 8 TB/s a GPU; the "
                  "host link at PCIe 5.0, the HGX hosts' (the GPU's own is PCIe 6.0)"),
}
"""Peak figures per catalog card (docs/time-model.md lists them with their sources). Only the H200's
step times are measured; every other card's predicted time is derived from these figures."""


def speed_of(card: GPU) -> Speed | None:
    """The card's speed figures; None for a card the catalog does not know (e.g. `this_card()`'s record)."""
    return SPEEDS.get(card.name)
