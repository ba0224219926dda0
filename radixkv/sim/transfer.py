"""Host <-> device KV copies for the simulated GPU: named links and the time a copy takes.

A copy of n tokens moves n * kv_bytes_per_token_per_gpu bytes over each GPU's own host link
(tensor-parallel ranks copy their shards in parallel), at the link's sustained rate:

    copy_time(n) = n * K / link.achieved_Bps

Rates are one direction. Sources: PCIe 5.0 x16 is 32 GT/s x 16 lanes with 128b/130b coding,
63 GB/s (PCI-SIG PCIe 5.0 specification), ~55 GB/s measured host-to-device with pinned
buffers (NVIDIA nvbandwidth on H100 SXM); PCIe 4.0 x16 is half, 31.5 GB/s, ~25 GB/s measured
(A100, L40S); NVLink-C2C joins Grace and Hopper at 900 GB/s total, 450 GB/s each way (NVIDIA
GH200 datasheet), ~375 GB/s measured host-to-device (NVIDIA Grace Hopper tuning guide).
"""
from __future__ import annotations

from dataclasses import dataclass

from radixkv.registry import Registry
from radixkv.argcheck import positive_number


@dataclass(frozen=True)
class HostLink:
    name: str
    peak_Bps: float           # one direction, from the specification
    achieved_Bps: float       # sustained, pinned host buffers

    def __post_init__(self):
        positive_number(self.peak_Bps, f"{self.name}: peak_Bps")
        positive_number(self.achieved_Bps, f"{self.name}: achieved_Bps")
        if self.achieved_Bps > self.peak_Bps:
            raise ValueError(f"{self.name}: achieved {self.achieved_Bps} > peak {self.peak_Bps}")

    def copy_time(self, tokens: int, bytes_per_token: int) -> float:
        return tokens * bytes_per_token / self.achieved_Bps


HOST_LINKS: Registry[HostLink] = Registry("host link")
for _link in (HostLink("pcie5-x16", 63e9, 55e9), HostLink("pcie4-x16", 31.5e9, 25e9),
              HostLink("nvlink-c2c", 450e9, 375e9)):
    HOST_LINKS.add(_link.name, _link)

# the host link of each named GPU (radixkv.sim.specs); GH200-class parts use nvlink-c2c
GPU_HOST_LINK = {"h100-sxm": "pcie5-x16", "h200": "pcie5-x16", "a100-80g": "pcie4-x16",
                 "l40s": "pcie4-x16"}


def host_link(gpu: str) -> HostLink:
    """The host link of GPU `gpu`; PCIe 5.0 x16 for a GPU not listed."""
    return HOST_LINKS.get(GPU_HOST_LINK.get(gpu, "pcie5-x16"))


def copies_time(copies, link: HostLink, bytes_per_token: int) -> float:
    """Seconds to run a plan's host-tier copies one after another."""
    return link.copy_time(sum(len(c.device) for c in copies), bytes_per_token)
