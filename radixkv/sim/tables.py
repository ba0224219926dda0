"""Measured step-time tables: aiconfigurator-core's per-kernel data (GEMM, context and
generation attention, all-reduce, measured on each engine release) for one model x GPU x
backend, tabulated once and kept on disk.

A step of the engine is priced from three parts, each read from aiconfigurator-core's
estimator and stored here on a geometric grid (all times ms):

  shared(T)      everything but attention for T tokens in the step (GEMMs, norms, all-reduce,
                 logits): `mixed_step_breakdown(T, 0, T)`'s non-attention share
  ctx_attn(n, p) context attention of one prefill segment, n new tokens after p cached:
                 `predict_prefill_latency(1, p + n, prefix=p) - shared(n)`
  dec_attn(b, c) generation attention of b decodes of context c each:
                 `decode_step_latency(b, c) - shared(b)`

so that a step of prefill segments (p_i, n_i) and b decodes of mean context c is
shared(sum n_i + b) + sum ctx_attn(n_i, p_i) + dec_attn(b, c) (radixkv.sim.measured).
The engine's KV capacity on the GPU (aiconfigurator-core's memory model at the backend's
default memory fraction) is stored beside them. aiconfigurator-core is imported only to
build a table; a built table is plain JSON.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from radixkv import env
from radixkv.sim.specs import ModelSpec

log = logging.getLogger(__name__)
FORMAT = 1
AIC_VERSION = "0.12.0"

# our names -> aiconfigurator-core's (models at the TP degree the spec serves them)
AIC_MODELS = {"llama-3-8b": "meta-llama/Meta-Llama-3.1-8B",
              "llama-3-70b": "meta-llama/Meta-Llama-3.1-70B"}
AIC_SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-80g": "a100_sxm",
               "l40s": "l40s"}
# (backend, GPU) -> the newest release whose tables aiconfigurator-core 0.12.0 ships
AIC_VERSIONS = {
    "vllm": {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "a100_sxm": "0.14.0", "l40s": "0.24.0"},
    "sglang": {"h100_sxm": "0.5.14", "h200_sxm": "0.5.14", "a100_sxm": "0.5.10", "l40s": "0.5.14"},
    "trtllm": {"h100_sxm": "1.3.0rc20", "h200_sxm": "1.3.0rc20", "a100_sxm": "1.0.0",
               "l40s": "1.3.0rc20"},
}
BACKENDS = tuple(AIC_VERSIONS)


def _grid(top: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, ... up to top: powers of two and their 1.5x."""
    out, k = [], 1
    while k <= top:
        out += [k] + ([k * 3 // 2] if k >= 2 and k * 3 // 2 <= top else [])
        k *= 2
    return sorted(set(out))


TOKENS = _grid(1 << 17)                 # tokens in a step
CTX_NEW = _grid(1 << 16)                # new tokens of a prefill segment
CTX_PREFIX = [0] + _grid(1 << 20)[4:]   # its cached prefix: 0, 16, 24, 32, ...
DEC_BATCH = _grid(4096)                 # decodes in a step
DEC_CTX = _grid(1 << 20)                # a decode's context


@dataclass(frozen=True)
class Timing:
    """Which tables price the steps: a backend at a release (`vllm:0.24.0`), or the
    roofline (`roofline`, no tables)."""
    backend: str
    version: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Timing":
        """`roofline`, `vllm`, `sglang`, `trtllm`, each optionally `:VERSION`."""
        backend, sep, version = str(text).partition(":")
        if backend == "roofline" and not sep:
            return cls("roofline")
        if backend not in BACKENDS or (sep and not version):
            raise ValueError(f"--timing {text!r}: expected roofline, or one of "
                             f"{', '.join(BACKENDS)} with an optional :VERSION")
        return cls(backend, version or None)

    @property
    def label(self) -> str:
        return self.backend if self.version is None else f"{self.backend}:{self.version}"


@dataclass(frozen=True)
class TimingTable:
    """One model x GPU x backend release's tables (ms), as built by `build_table`."""
    model: str
    system: str
    backend: str
    version: str
    tp: int
    shared_ms: tuple[float, ...]                    # over TOKENS
    ctx_attn_ms: tuple[tuple[float, ...], ...]      # [CTX_NEW][CTX_PREFIX]
    dec_attn_ms: tuple[tuple[float, ...], ...]      # [DEC_BATCH][DEC_CTX]
    kv_capacity_tokens: int                         # the engine's pool at its defaults
    kv_memory: dict                                 # how the capacity was reached

    @property
    def label(self) -> str:
        return f"aiconfigurator-core {AIC_VERSION} {self.backend} {self.version} tables"

    def to_json(self) -> dict:
        return {"format": FORMAT, "source": f"aiconfigurator-core {AIC_VERSION}",
                "model": self.model, "system": self.system, "backend": self.backend,
                "version": self.version, "tp": self.tp,
                "tokens": TOKENS, "ctx_new": CTX_NEW, "ctx_prefix": CTX_PREFIX,
                "dec_batch": DEC_BATCH, "dec_ctx": DEC_CTX,
                "shared_ms": list(self.shared_ms),
                "ctx_attn_ms": [list(r) for r in self.ctx_attn_ms],
                "dec_attn_ms": [list(r) for r in self.dec_attn_ms],
                "kv_capacity_tokens": self.kv_capacity_tokens, "kv_memory": self.kv_memory}

    @classmethod
    def from_json(cls, doc: dict) -> "TimingTable":
        grids = (doc.get("format"), doc.get("tokens"), doc.get("ctx_new"), doc.get("ctx_prefix"),
                 doc.get("dec_batch"), doc.get("dec_ctx"))
        if grids != (FORMAT, TOKENS, CTX_NEW, CTX_PREFIX, DEC_BATCH, DEC_CTX):
            raise ValueError("timing table of another format or grid")
        return cls(doc["model"], doc["system"], doc["backend"], doc["version"], int(doc["tp"]),
                   tuple(doc["shared_ms"]), tuple(tuple(r) for r in doc["ctx_attn_ms"]),
                   tuple(tuple(r) for r in doc["dec_attn_ms"]),
                   int(doc["kv_capacity_tokens"]), dict(doc["kv_memory"]))


def covered(model: str, spec: ModelSpec, gpu: str, timing: Timing) -> tuple[str, str, str] | None:
    """(aic model, aic system, version) when the tables cover the pair, else None."""
    if timing.backend == "roofline":
        return None
    aic_model, system = AIC_MODELS.get(spec.model.name), AIC_SYSTEMS.get(gpu)
    if aic_model is None or system is None or system not in AIC_VERSIONS[timing.backend]:
        return None
    return aic_model, system, timing.version or AIC_VERSIONS[timing.backend][system]


def table_path(aic_model: str, system: str, backend: str, version: str, tp: int) -> Path:
    slug = aic_model.replace("/", "--")
    return env.cache_dir() / "timing" / f"{slug}-{system}-{backend}-{version}-tp{tp}.json"


def load_table(aic_model: str, system: str, backend: str, version: str, tp: int) -> TimingTable:
    """The table from the disk cache, built (a few seconds) and written there when absent."""
    path = table_path(aic_model, system, backend, version, tp)
    try:
        return TimingTable.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass                                      # absent, partial or older: rebuild
    table = build_table(aic_model, system, backend, version, tp)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(table.to_json()))
        os.replace(tmp, path)                     # concurrent builders: last one wins, whole
    except OSError as e:                          # a read-only or full disk: run uncached
        log.warning("timing table not cached at %s (%s); it is rebuilt on every run", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()
    return table


def _engine_defaults(backend: str, hbm_bytes: int, tp: int) -> tuple[float, int, int]:
    """(memory fraction of the total, batched-token budget, running-request cap) the engine
    ships with: vLLM's gpu_memory_utilization 0.9, max_num_batched_tokens 8192 and
    max_num_seqs 256; SGLang's capacity-tiered mem_fraction_static (derived as SGLang does,
    by aiconfigurator-core), chunked prefill 8192 and 256 decode graphs on 60-160 GB GPUs;
    TensorRT-LLM's free_gpu_memory_fraction 0.9 (of the memory left after the weights)."""
    if backend == "sglang":
        from aiconfigurator_core.sdk.backends.sglang_backend import derive_sglang_mem_fraction_static
        return derive_sglang_mem_fraction_static(hbm_bytes, tp_size=tp), 8192, 256
    return 0.9, 8192, 256


def build_table(aic_model: str, system: str, backend: str, version: str, tp: int) -> TimingTable:
    """Query aiconfigurator-core over the grids (about a second or two per table)."""
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    try:
        from aiconfigurator_core.sdk import EngineHandle
        from aiconfigurator_core.sdk.memory import estimate_kv_cache
    except ImportError as e:                       # a pinned dependency: the install is broken
        raise RuntimeError(f"measured timing needs aiconfigurator-core=={AIC_VERSION} "
                           f"({e}); reinstall radixkv, or pass --timing roofline") from None
    try:
        eng = EngineHandle.compile(aic_model, system, backend, backend_version=version,
                                   tp_size=tp)
    except Exception as e:                         # the estimator's own errors name no flag
        raise ValueError(f"--timing {backend}:{version}: aiconfigurator-core has no tables for "
                         f"{aic_model} on {system} at tp {tp} ({e})") from None
    shared = [eng.mixed_step_breakdown(t, 0, t, 2, 0)[1] for t in TOKENS]
    by_tokens = dict(zip(TOKENS, shared))
    ctx = [[eng.predict_prefill_latency(1, p + n, prefix=p) - by_tokens[n] for p in CTX_PREFIX]
           for n in CTX_NEW]
    dec = [[eng.decode_step_latency(b, c, 2) - by_tokens[b] for c in DEC_CTX] for b in DEC_BATCH]
    hbm = _system_memory(system)
    fraction, tokens, seqs = _engine_defaults(backend, hbm, tp)
    est = estimate_kv_cache(aic_model, system, backend, backend_version=version, tp_size=tp,
                            max_num_tokens=tokens, max_batch_size=seqs,
                            memory_fraction_kind="of_free" if backend == "trtllm" else "of_total",
                            memory_fraction_value=fraction)
    memory = {"gpu_bytes": int(est["total_gpu_capacity_bytes"]), "memory_fraction": fraction,
              "kv_bytes": int(est["total_kv_size_bytes"]),
              "kv_bytes_per_token": int(est["kv_size_per_token_bytes"]),
              **{k: int(v) for k, v in (est.get("memory_breakdown") or {}).items()}}
    return TimingTable(aic_model, system, backend, version, tp, tuple(shared),
                       tuple(tuple(r) for r in ctx), tuple(tuple(r) for r in dec),
                       int(est["total_kv_size_tokens"]), memory)


def _system_memory(system: str) -> int:
    """The GPU's memory in bytes as aiconfigurator-core's system file records it."""
    from aiconfigurator_core.sdk.perf_database import load_system_spec
    return int(load_system_spec(system)["gpu"]["mem_capacity"])
