"""The links between GPUs, each figure with its source: within a node (NVLink or PCIe) and between nodes
(InfiniBand or RoCE, one NIC per GPU), and the shape of a cluster (`parse_cluster`: "8xH100", "2x8xH100").

Bandwidths are per GPU and per direction, in GB/s (10**9 bytes), the peak a collective's bus bandwidth
(nccl-tests' busbw, doc/PERFORMANCE.md) is measured against: NVIDIA quotes NVLink bidirectionally (the H100's
900 GB/s is 450 GB/s each way), InfiniBand and Ethernet per direction in Gb/s (NDR's 400 Gb/s is 50 GB/s).
What NCCL achieves is lower than these peaks, so a time from them is a lower bound on the bandwidth term.
Latencies are NCCL's own model of a ring step with its Simple protocol (NVIDIA/nccl src/graph/tuning.cc:
`baseLat` 8.4 us per collective, `hwLat` Ring/Simple 5.7 us per step over NVLink or PCIe, 6.6 us over the
network), not measurements of this cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .gpus import GPU, find_gpu, gpu_problem, speed_of

NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (baseLat, hwLat: Ring, Simple protocol)"
BASE_LATENCY_S = 8.4e-6
"""NCCL's fixed latency of a ring collective with the Simple protocol (`baseLat`)."""


@dataclass(frozen=True)
class Link:
    """One GPU's link to its peers: its peak bandwidth each way and the latency of one ring step over it."""

    name: str
    gbs: float
    """Peak GB/s per GPU per direction (the bus bandwidth NCCL's busbw is compared with)."""
    latency_s: float
    """Seconds per ring step (NCCL's `hwLat`, Ring/Simple)."""
    source: str


_NVLINK = {
    "NVLink2": (150.0, "NVIDIA V100 datasheet (SXM2): NVLink 300 GB/s bidirectional per GPU"),
    "NVLink3": (300.0, "NVIDIA A100 datasheet (SXM4): NVLink 600 GB/s bidirectional per GPU "
                       "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                       "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"),
    "NVLink4": (450.0, "NVIDIA H100 / H200 datasheets (SXM): NVLink 900 GB/s bidirectional per GPU, 18 fourth-generation "
                       "links (https://www.nvidia.com/en-us/data-center/h100/; MLPerf system descriptions: "
                       "\"18x 4th Gen NVLink, 900GB/s\")"),
    "NVLink5": (900.0, "NVIDIA HGX B200 / B300 datasheets: fifth-generation NVLink 1.8 TB/s bidirectional per GPU "
                       "(14.4 TB/s for the 8-GPU board; https://www.nvidia.com/en-us/data-center/hgx/)"),
}
NVLINK_CARDS = {"V100-16GB": "NVLink2", "V100-32GB": "NVLink2", "A100-40GB": "NVLink3", "A100-80GB": "NVLink3",
                "H100-80GB": "NVLink4", "H200": "NVLink4", "B200": "NVLink5", "B300": "NVLink5"}
"""The SXM cards of the catalog and their NVLink generation, all GPUs of a node joined through NVSwitch (HGX
boards; V100 SXM2 boards use a hybrid cube mesh, taken at the same per-GPU figure). The NVL cards' bridges join
pairs only, so a node of them, like every PCIe card, talks over PCIe."""

NETWORKS: dict[str, Link] = {
    "ib-ndr": Link("InfiniBand NDR", 50.0, 6.6e-6,
                   "400 Gb/s per GPU: DGX H100/H200/B200 use eight single-port ConnectX-7 NICs, one per GPU, at up to "
                   "400 Gb/s InfiniBand for the compute fabric (https://docs.nvidia.com/dgx-basepod/reference-"
                   "architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html); " + NCCL_TUNING),
    "ib-hdr": Link("InfiniBand HDR", 25.0, 6.6e-6,
                   "200 Gb/s per GPU: DGX A100's eight single-port ConnectX-6 HDR NICs (NVIDIA DGX A100 User Guide, "
                   "network ports); " + NCCL_TUNING),
    "roce-400": Link("RoCE 400GbE", 50.0, 6.6e-6,
                     "400 Gb/s Ethernet per GPU (ConnectX-7 400GbE, RDMA over Converged Ethernet; the same NIC as "
                     "ib-ndr, NVIDIA MLNX_OFED release notes, supported uplinks); " + NCCL_TUNING),
    "roce-200": Link("RoCE 200GbE", 25.0, 6.6e-6,
                     "200 Gb/s Ethernet per GPU (ConnectX-6/7 200GbE; NVIDIA MLNX_OFED release notes, supported "
                     "uplinks); " + NCCL_TUNING),
}
"""The links between nodes, per GPU (one NIC per GPU, rail-optimized): `--network` picks one."""
DEFAULT_NETWORK = "ib-ndr"


def intra_node(card: GPU) -> Link | None:
    """The link between GPUs of one node of `card`s: NVLink for the SXM cards, else the card's PCIe host link
    (`gpus.SPEEDS`); None for a card with no speed figures."""
    gen = NVLINK_CARDS.get(card.name)
    if gen is not None:
        gbs, source = _NVLINK[gen]
        return Link(gen, gbs, 5.7e-6, f"{source}; {NCCL_TUNING}")
    speed = speed_of(card)
    if speed is None:
        return None
    return Link(f"PCIe ({speed.pcie_gbs:g} GB/s)", speed.pcie_gbs, 5.7e-6,
                f"the card's host link, per direction (gpus.SPEEDS: {speed.source}); {NCCL_TUNING}")


def network_problem(name: object) -> str | None:
    """Why `name` names no network, in one line; None when it does."""
    if isinstance(name, str) and name in NETWORKS:
        return None
    return f"--network: {name!r} is not one of {', '.join(NETWORKS)} (the link between nodes, per GPU)"


@dataclass(frozen=True)
class Cluster:
    """Nodes of identical cards."""

    nodes: int
    per_node: int
    card: GPU

    @property
    def gpus(self) -> int:
        return self.nodes * self.per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.per_node}x{self.card.name}" if self.nodes > 1 else f"{self.per_node}x{self.card.name}"


CLUSTER_FORM = "GPUSxCARD or NODESxGPUSxCARD, e.g. 8xH100 or 2x8xH100-80GB"


def parse_cluster(text: str, nodes: int | None = None) -> Cluster:
    """"8xH100" (one node of 8) or "2x8xH100" (2 nodes of 8) as a Cluster; `nodes` (`--nodes`) gives the nodes of
    the first form. A ValueError whose text is the one-line problem, naming `--cluster` or `--nodes`."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*[xX*]\s*)?(\d+)\s*[xX*]\s*(\S.*?)\s*", str(text))
    if not m:
        raise ValueError(f"--cluster: {text!r} is not {CLUSTER_FORM}")
    count, per_node, name = int(m.group(1) or 0), int(m.group(2)), m.group(3)
    card = find_gpu(name)
    if card is None:
        raise ValueError((gpu_problem(name) or name).replace("--gpu:", "--cluster:", 1).replace(" (or cap by bytes with --memory-cap)", ""))
    if per_node < 1 or m.group(1) is not None and count < 1:
        raise ValueError(f"--cluster: {text!r} needs at least one node of at least one GPU ({CLUSTER_FORM})")
    if count and nodes is not None and nodes != count:
        raise ValueError(f"--nodes {nodes}: --cluster {text} already says {count} nodes; drop --nodes or make "
                         "them agree")
    return Cluster(count or nodes or 1, per_node, card)


__all__ = ["Link", "NETWORKS", "DEFAULT_NETWORK", "NVLINK_CARDS", "BASE_LATENCY_S", "intra_node",
           "network_problem", "Cluster", "parse_cluster", "CLUSTER_FORM"]
