"""A catalog of GPUs with the memory a training process can really use on each.

`capacity` is the total that PyTorch reports on that card (`torch.cuda.get_device_properties().total_memory`,
the "total capacity" in its OOM messages), which is already less than the marketing size (ECC, driver
reserve). `context` is what the CUDA context and kernel images take outside the PyTorch allocator on that
card; it is an estimate (0.4 GiB unless measured), because it depends on the driver and on which libraries
load. `--gpu NAME` caps the caching allocator at `capacity - context`, so that a bigger card reproduces a
smaller card's OOM.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class GPU:
    name: str
    capacity: int
    """Bytes PyTorch reports as the card's total memory."""
    context: int = int(0.4 * GiB)
    """Bytes outside the allocator: CUDA context, cuBLAS/cuDNN kernels (estimate unless measured)."""
    source: str = "total capacity in PyTorch OOM messages reported by users of this card"

    @property
    def usable(self) -> int:
        """Bytes the caching allocator may reserve before this card runs out."""
        return self.capacity - self.context

    def budget(self, margin: float) -> int:
        """Bytes a run may need on this card (peak reserved + context) and still count as fitting,
        keeping `margin` (a fraction of capacity) free: the one rule for estimates and real runs."""
        return int(self.capacity * (1 - margin))


def _gib(x: float) -> int:
    return int(x * GiB)


CATALOG: dict[str, GPU] = {g.name: g for g in [
    GPU("T4", _gib(14.75)),
    GPU("V100-16GB", _gib(15.77)),
    GPU("V100-32GB", _gib(31.74)),
    GPU("L4", _gib(22.03)),
    GPU("A10G", _gib(22.19)),
    GPU("RTX-3090", _gib(23.69)),
    GPU("RTX-4090", _gib(23.64)),
    GPU("A6000", _gib(47.54)),
    GPU("L40S", _gib(44.53)),
    GPU("A100-40GB", _gib(39.39)),
    GPU("A100-80GB", _gib(79.15)),
    GPU("H100-80GB", _gib(79.11)),
    # Measured on the H200 used for docs/ (2026-12-02): total_memory and the CUDA context, torch 2.11.
    GPU("H200", 150_109_880_320, context=552_402_944, source="measured, docs/run-chapter-h200.md"),
]}


def find_gpu(name: str) -> GPU | None:
    """Case-insensitive lookup that ignores '-' and '_' (t4, A100_80GB, h100-80gb all work)."""
    norm = name.replace("_", "-").upper()
    for key, gpu in CATALOG.items():
        if key.upper() == norm or key.upper().replace("-", "") == norm.replace("-", ""):
            return gpu
    return None
