"""What a healthy node of each GPU model reaches, as data: the all-reduce's bus bandwidth floor and the
NVLinks each GPU has, keyed by the product name the driver reports (`nvidia-smi -q`'s "Product Name",
`nvidia-smi nvlink --status`'s GPU lines).

The floor is for the check's own run: `all_reduce_perf -b 128M -e 4G -f 2` on all of the node's GPUs,
read from its "Avg bus bandwidth" line (nccl-tests doc/PERFORMANCE.md: busbw, the figure that does not
depend on the GPU count). Each floor sits about a fifth under the published figure, so a healthy node's
run-to-run spread passes and a node with a link down, a GPU on a degraded PCIe link or traffic falling
back off NVLink does not (those land at a fraction of it: a two-node H100 run over the network reads 142.7
GB/s, NVIDIA/nccl-tests issue #290). A model missing here has no floor: its all-reduce is judged on its
results alone and the check says so; add its row (and its source) to give it one.
"""
from __future__ import annotations

from dataclasses import dataclass

CHECK_SIZES = ("-b", "128M", "-e", "4G", "-f", "2")  # the sizes the floors below were taken at


@dataclass(frozen=True)
class ModelFloor:
    product: str  # as the driver names it
    gpus: int  # the GPU count the bandwidth floor holds for (one NVSwitch board)
    bus_bandwidth_gbps: float  # "Avg bus bandwidth" of the check's all-reduce, at least
    nvlinks: int  # NVLinks per GPU, each active
    nvlink_gbps: float  # each link's speed as `nvidia-smi nvlink --status` prints it
    source: str


_H100_SOURCE = (
    "NVIDIA/nccl-tests issue #290: 8x 'NVIDIA H100 80GB HBM3', all_reduce_perf -b 128M -e 4G -f 2, Avg bus "
    "bandwidth 439.369 (peak 476.5), which NVIDIA's reply calls 'in the expected range for H100'; issue #212 "
    "(NVIDIA): 'On 8 GPUs, you should reach a peak busBw of ~480GB/s' with NVLink SHARP, ~370 GB/s with RING. "
    "NVLinks: 18 per GPU at 26.562 GB/s, as `nvidia-smi nvlink --status` prints them on an H100 SXM "
    "(tests/fixtures/gpu/SOURCES.md)")

FLOORS: tuple[ModelFloor, ...] = (
    ModelFloor("NVIDIA H100 80GB HBM3", 8, 350.0, 18, 26.562, _H100_SOURCE),
    # H200 SXM: the same NVLink 4 (18 links, 900 GB/s per GPU) and third-generation NVSwitch as the HGX H100
    # (NVIDIA's H200 product page); its links print as the H100's (a published 8x H200 `nvidia-smi nvlink -s`).
    ModelFloor("NVIDIA H200", 8, 350.0, 18, 26.562, "as the H100 SXM: " + _H100_SOURCE),
    # A100 SXM4: NVLink 3, 12 links per GPU at 25 GB/s per direction (NVIDIA A100 datasheet: 600 GB/s
    # bidirectional); 8x A100-SXM4-80GB all-reduce busbw ~200 GB/s (NVIDIA/nccl-tests issue #149).
    ModelFloor("NVIDIA A100-SXM4-80GB", 8, 160.0, 12, 25.0, "NVIDIA/nccl-tests issue #149; NVIDIA A100 datasheet"),
    ModelFloor("NVIDIA A100-SXM4-40GB", 8, 160.0, 12, 25.0, "NVIDIA/nccl-tests issue #149; NVIDIA A100 datasheet"),
)


def floor_for(product: str) -> ModelFloor | None:
    return next((f for f in FLOORS if f.product == product.strip()), None)
