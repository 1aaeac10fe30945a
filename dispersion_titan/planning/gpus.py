"""The GPUs a plan is made for: their memory and published peaks (NVIDIA's data sheets, SXM
parts, dense bf16), and the links their collectives cross."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float
    """Memory as NVIDIA sells it, in GB (10^9 bytes): what a plan's peak must stay under."""
    bf16_flops: float
    """Dense bf16 (and fp16) tensor-core FLOP/s."""
    fp32_flops: float
    """Dense fp32 FLOP/s without tensor cores (fp32 matmuls and elementwise math)."""
    hbm_bytes_per_s: float
    node_link_bytes_per_s: float
    """NVLink bandwidth one GPU sends at inside a node, one direction."""
    network_bytes_per_s: float
    """InfiniBand bandwidth per GPU between nodes (one NIC per GPU), one direction."""
    gpus_per_node: int = 8


GPUS = {
    "h100": GPU("H100 SXM 80GB", 80, 989e12, 67e12, 3.35e12, 450e9, 50e9),
    "h200": GPU("H200 SXM 141GB", 141, 989e12, 67e12, 4.8e12, 450e9, 50e9),
    "a100": GPU("A100 SXM 80GB", 80, 312e12, 19.5e12, 2.039e12, 300e9, 25e9),
}
"""NDR InfiniBand (400 Gb/s) per H100/H200, HDR (200 Gb/s) per A100."""
