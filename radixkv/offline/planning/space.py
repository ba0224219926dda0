"""What `radixkv plan` searches: deployments of one model on named GPUs, each a family (every
setting but the replica counts) sized by its replicas (aggregated) or its prefill and decode
replicas (disaggregated), and the `radixkv cluster` run that simulates one.

A family fixes the GPU, the tensor-parallel degree, the KV memory per GPU (a share of what the
engine would allocate), the cache design, its page size and eviction order, the scheduler's
queue order and the router; a candidate adds the replica counts, and costs its GPUs
(tp x replicas) for the trace's span.
"""
from __future__ import annotations

from collections.abc import Sequence

import itertools
from dataclasses import dataclass, replace
from functools import lru_cache

from radixkv.cache.config import CacheConfig
from radixkv.config import EngineConfig
from radixkv.router import ROUTERS
from radixkv.offline.cluster.simulator import ClusterConfig
from radixkv.offline.cluster.disagg import DisaggConfig, decode_engine
from radixkv.sched.config import SchedulerConfig
from radixkv.sim.kv_links import KV_LINKS
from radixkv.sim.measured import NamedReplica, named_replica
from radixkv.argcheck import positive_fraction, positive_int

MODES = ("aggregated", "disaggregated")
BLOCK = "blockhash"


@dataclass(frozen=True, order=True)
class Family:
    mode: str                    # aggregated | disaggregated
    gpu: str
    tp: int
    kv_fraction: float           # of the engine's KV allocation per GPU
    cache: str                   # radix | blockhash | none
    page_size: int
    eviction: str                # the radix cache's order (lru for the others)
    schedule: str
    router: str

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        positive_int(self.tp, "tp")
        positive_fraction(self.kv_fraction, "kv_fraction")
        positive_int(self.page_size, "page_size")
        ROUTERS.get(self.router)

    @property
    def disaggregated(self) -> bool:
        return self.mode == "disaggregated"

    def label(self) -> str:
        kv = "" if self.kv_fraction == 1 else f" kv×{self.kv_fraction:g}"
        mode = "disagg " if self.disaggregated else ""
        ev = f" {self.eviction}" if self.cache == "radix" else ""
        return (f"{mode}{self.gpu} tp{self.tp}{kv} {self.cache}/{self.page_size}{ev} "
                f"{self.schedule} {self.router}")

    def with_cache(self, cache: str) -> Family:
        return replace(self, cache=cache, eviction=self.eviction if cache == "radix" else "lru")


@dataclass(frozen=True, order=True)
class Candidate:
    family: Family
    replicas: int = 0            # aggregated
    prefill: int = 0             # disaggregated
    decode: int = 0

    def __post_init__(self):
        if self.family.disaggregated:
            positive_int(self.prefill, "prefill replicas")
            positive_int(self.decode, "decode replicas")
        else:
            positive_int(self.replicas, "replicas")

    @property
    def workers(self) -> int:
        return self.prefill + self.decode if self.family.disaggregated else self.replicas

    @property
    def gpus(self) -> int:
        return self.workers * self.family.tp

    def label(self) -> str:
        size = (f"{self.prefill}P+{self.decode}D" if self.family.disaggregated
                else f"{self.replicas}×")
        return f"{size} {self.family.label()}"


@dataclass(frozen=True)
class Setting:
    """What every candidate shares: the model, the timing, the link, the seed."""
    model: str
    timing: str | None = None
    kv_link: str = "rdma"
    seed: int = 0

    def __post_init__(self):
        KV_LINKS.get(self.kv_link)

    def replica(self, gpu: str, tp: int) -> NamedReplica:
        return _replica(self.model, gpu, tp, self.timing)

    def kv_tokens(self, fam: Family) -> int:
        """KV tokens per worker, whole pages."""
        cap = int(self.replica(fam.gpu, fam.tp).kv_capacity * fam.kv_fraction)
        return cap - cap % fam.page_size

    def engine(self, fam: Family) -> EngineConfig:
        kw = {"eviction": fam.eviction} if fam.cache == "radix" else {}
        cache = CacheConfig(kind=fam.cache, page_size=fam.page_size, **kw)
        return EngineConfig(kv_capacity=self.kv_tokens(fam), cache=cache,
                            sched=SchedulerConfig(policy=fam.schedule, seed=self.seed))

    def config(self, c: Candidate) -> ClusterConfig | DisaggConfig:
        eng = self.engine(c.family)
        if c.family.disaggregated:
            return DisaggConfig(eng, decode_engine(eng), c.prefill, c.decode, self.kv_link,
                                seed=self.seed)
        return ClusterConfig(eng, c.replicas, self.seed)

    def cluster_args(self, c: Candidate, trace: str, workload_args: Sequence[str] = ()
                     ) -> list[str]:
        """The `radixkv cluster` arguments that simulate `c` alone; `workload_args` are the
        flags that shaped the workload (--tokenizer, --trace-block-size, ...), passed on."""
        f = c.family
        args = [trace, *workload_args, "--model", self.model, "--gpu", f.gpu, "--tp", str(f.tp)]
        if self.timing is not None:
            args += ["--timing", self.timing]
        args += ["--cache", f.cache]
        args += ["--block-size" if f.cache == BLOCK else "--page-size", str(f.page_size)]
        if f.cache == "radix":
            args += ["--radix-eviction-policy", f.eviction]
        args += ["--schedule-policy", f.schedule, "--max-total-tokens", str(self.kv_tokens(f)),
                 "--router", f.router, "--seed", str(self.seed)]
        if f.disaggregated:
            args += ["--prefill-replicas", str(c.prefill), "--decode-replicas", str(c.decode),
                     "--kv-link", self.kv_link]
        else:
            args += ["--replicas", str(c.replicas)]
        return args


@lru_cache(maxsize=64)
def _replica(model: str, gpu: str, tp: int, timing: str | None) -> NamedReplica:
    return named_replica(model, gpu, tp=tp, timing=timing)


def families(setting: Setting, *, gpus, tps, kv_fractions, caches, page_sizes, evictions,
             schedules, routers, modes) -> list[Family]:
    """Every family of the product whose model fits the GPU at that TP degree (a KV pool of
    at least one page); the radix cache's eviction orders only for the radix cache."""
    out = []
    for mode, gpu, tp, frac, cache, ps, sched, router in itertools.product(
            modes, gpus, tps, kv_fractions, caches, page_sizes, schedules, routers):
        for ev in (evictions if cache == "radix" else ("lru",)):
            fam = Family(mode, gpu, tp, frac, cache, ps, ev, sched, router)
            try:
                fits = setting.kv_tokens(fam) >= ps
            except ValueError:                   # the model does not fit at all
                fits = False
            if fits:
                out.append(fam)
    return sorted(set(out))
