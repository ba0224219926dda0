"""GPU-to-GPU KV links of disaggregated serving: the named links a prefill worker sends a
request's KV over to a decode worker, and the time one transfer takes.

Each tensor-parallel rank sends its own shard over its own link (one NIC per GPU in DGX-class
nodes), so a transfer of n tokens moves n * kv_bytes_per_token_per_gpu bytes per link:

    transfer_time(n) = latency + n * K / link.achieved_Bps

Transfers from one prefill worker share its link one after another (the latency is a per-
transfer setup that overlaps the previous transfer's bytes, so only the bytes queue). Rates are
one direction. Sources:
- nvlink: NVLink 4 on H100 / H200 SXM, 18 links x 25 GB/s = 450 GB/s each way (NVIDIA H100
  datasheet: 900 GB/s bidirectional); ~370 GB/s measured device-to-device copies (NVIDIA
  nvbandwidth on DGX H100). Latency: a copy's launch and completion event, ~10 us.
- rdma (InfiniBand NDR, ConnectX-7): 400 Gb/s = 50 GB/s each way per NIC, one NIC per GPU
  (NVIDIA DGX H100 user guide); ~45 GB/s GPUDirect RDMA writes from HBM (perftest ib_write_bw
  --use_cuda, ~360 Gb/s). rdma-200g (HDR / RoCE 200 Gb/s, ConnectX-6): 25 GB/s, ~22 GB/s.
  Latency: ~5 us on the wire and NICs plus the transfer library's request and completion
  notice (NIXL over UCX), ~50 us in all; an estimate, not a measurement.
- pcie5-x16 / pcie4-x16: peer-to-peer through a PCIe switch, no NVLink (L40S-class nodes):
  63 / 31.5 GB/s each way (PCI-SIG specifications), ~50 / ~25 GB/s measured peer copies.
  Latency ~10 us.
"""
from __future__ import annotations

from dataclasses import dataclass

from radixkv.registry import Registry
from radixkv.argcheck import finite_at_least, positive_number


@dataclass(frozen=True)
class KVLink:
    name: str
    peak_Bps: float           # one direction, per GPU, from the specification
    achieved_Bps: float       # sustained
    latency_s: float          # per transfer: setup and completion notice

    def __post_init__(self):
        positive_number(self.peak_Bps, f"{self.name}: peak_Bps")
        positive_number(self.achieved_Bps, f"{self.name}: achieved_Bps")
        finite_at_least(self.latency_s, f"{self.name}: latency_s", 0)
        if self.achieved_Bps > self.peak_Bps:
            raise ValueError(f"{self.name}: achieved {self.achieved_Bps} > peak {self.peak_Bps}")

    def bytes_time(self, tokens: int, bytes_per_token: int) -> float:
        """Seconds the link is busy moving `tokens` tokens' KV (without the latency)."""
        return tokens * bytes_per_token / self.achieved_Bps

    def transfer_time(self, tokens: int, bytes_per_token: int) -> float:
        return self.latency_s + self.bytes_time(tokens, bytes_per_token)


KV_LINKS: Registry[KVLink] = Registry("KV link")
for _link in (KVLink("nvlink", 450e9, 370e9, 10e-6),
              KVLink("rdma", 50e9, 45e9, 50e-6),
              KVLink("rdma-200g", 25e9, 22e9, 50e-6),
              KVLink("pcie5-x16", 63e9, 50e9, 10e-6),
              KVLink("pcie4-x16", 31.5e9, 25e9, 10e-6)):
    KV_LINKS.add(_link.name, _link)

DEFAULT_KV_LINK = "rdma"      # prefill and decode pools on different nodes


class LinkQueue:
    """One prefill worker's link: transfers in the order they are sent, each starting when its
    KV is ready and the previous transfer's bytes are through."""

    def __init__(self, link: KVLink, bytes_per_token: int):
        self.link, self.bytes_per_token = link, bytes_per_token
        self.free_at = 0.0          # when the bytes queued so far are through
        self.busy_s = 0.0
        self.sent_tokens = 0

    def send(self, ready: float, tokens: int) -> tuple[float, float]:
        """(start, arrival at the decode worker) of a transfer of `tokens` ready at `ready`."""
        start = max(ready, self.free_at)
        busy = self.link.bytes_time(tokens, self.bytes_per_token)
        self.free_at = start + busy
        self.busy_s += busy
        self.sent_tokens += tokens
        return start, self.free_at + self.link.latency_s
