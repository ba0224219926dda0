"""Everything a server is made of, built from its options and engine configuration: the
executor (a real model, or the simulated GPU), the engine and its thread, the tokenizer and
chat template, metrics, KV-event publisher and tenants. `radixkv serve` and the tests both
build servers here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixkv import __version__, env
from radixkv.config import EngineConfig
from radixkv.engine.engine import Engine
from radixkv.kvevents.publisher import KVEventsConfig, make_publisher
from radixkv.server.guard import DEFAULT_CLIENT_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from radixkv.server.state import ServerState
from radixkv.server.metrics import ServerMetrics
from radixkv.server.tenants import Tenants
from radixkv.server.text import ChatTemplate
from radixkv.server.worker import EngineWorker
from radixkv.shapes import MODEL_CONFIGS
from radixkv.sim.specs import GPU_SPECS, MODEL_SPECS
from radixkv.argcheck import choice, positive_int, positive_number

EXECUTORS = ("torch", "sim")
# what the simulated GPU "generates" with the byte tokenizer: lowercase text that round-trips
SIM_OUTPUT = b"the quick brown fox jumps over the lazy dog "


@dataclass(frozen=True)
class ServeOptions:
    model: str = "tiny-llama"                 # a named shape or a checkpoint directory
    executor: str = "torch"
    gpu: str = "h100-sxm"                     # sim: the cost model's GPU
    served_model_name: str | None = None      # the API's model id (default: `model`)
    max_model_len: int | None = None          # default: the model's context
    enable_metrics: bool = False
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    tenants: Tenants = field(default_factory=Tenants)
    allow_client_cache_salt: bool = False
    device: str | None = None                 # torch: cpu | cuda | cuda:N
    dtype: str | None = None                  # torch: bfloat16 | float16 | float32
    threads: int = 1                          # torch on the CPU: intra-op threads
    tokenizer: str | None = None
    seed: int = 0
    tp: int | None = None                     # sim: the TP degree (default: the model spec's)
    profile: str | None = None                # sim: a `radixkv calibrate` profile for --model
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT    # s: headers, body, each response write
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES   # a larger body is answered 413

    def __post_init__(self):
        choice(self.executor, "executor", EXECUTORS)
        positive_int(self.threads, "threads")
        positive_number(self.client_timeout, "client_timeout")
        positive_int(self.max_request_bytes, "max_request_bytes")
        if self.max_model_len is not None:
            positive_int(self.max_model_len, "max_model_len")
        if self.executor != "sim" and (self.tp is not None or self.profile is not None):
            raise ValueError("tp and profile apply to the simulated executor (--executor sim)")
        if self.tp is not None:
            positive_int(self.tp, "tp")
        if self.profile is not None:
            if self.tp is not None:
                raise ValueError(f"tp {self.tp} does not apply with a profile: the profile "
                                 f"measured one device")
        elif self.executor == "sim":
            choice(self.model, "simulated model", MODEL_SPECS)
            choice(self.gpu, "gpu", GPU_SPECS)
        elif self.model not in MODEL_CONFIGS and not Path(self.model).is_dir():
            raise ValueError(f"unknown model {self.model!r}: not a named shape "
                             f"({', '.join(MODEL_CONFIGS)}) nor a checkpoint directory")

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


def _torch_parts(opts: ServeOptions, cfg: EngineConfig) -> tuple[Any, Any, Any]:
    """(executor, model args, sampling factory) of the real model."""
    from radixkv.model.sampling import SamplingParams
    from radixkv.model.setup import torch_target

    target = torch_target(opts.model, opts.device, opts.dtype, opts.threads, "threads")
    target.check_kv_memory(cfg.kv_capacity)
    ex = target.executor(cfg.kv_capacity, seed=opts.seed, host_slots=cfg.cache.host_kv_tokens)
    margs = target.args

    def sampling(body, max_tokens: int):
        return SamplingParams(body.temperature, body.top_p, max(body.top_k, 0), body.seed,
                              max_tokens)
    return ex, margs, sampling


def sim_cost(opts: ServeOptions):
    """The simulated GPU's step prices: the profile measured for --model, else the named model
    on the named GPU at the TP degree, priced by its measured tables where they cover it."""
    from radixkv.sim.measured import named_cost
    if opts.profile is not None:
        from radixkv.sim.profile import load_profile
        return load_profile(opts.profile, model=opts.model).cost_model()
    return named_cost(opts.model, opts.gpu, tp=opts.tp)


def tokenizer_path(opts: ServeOptions) -> str | None:
    """--tokenizer, else the checkpoint's tokenizer.json, else None (bytes)."""
    if opts.tokenizer is None and Path(opts.model).is_dir() and \
            (Path(opts.model) / "tokenizer.json").is_file():
        return str(Path(opts.model) / "tokenizer.json")
    return opts.tokenizer


def load_text(opts: ServeOptions, vocab_size: int | None = None) -> tuple[Any, ChatTemplate]:
    """The tokenizer (--tokenizer, else the checkpoint's, else bytes: as many ids as the model's
    vocabulary, `vocab_size`) and chat template."""
    from radixkv.tokenizer import load_tokenizer  # no torch needed

    tokenizer = load_tokenizer(tokenizer_path(opts), vocab_size)
    model_dir = opts.model if Path(opts.model).is_dir() else None
    return tokenizer, ChatTemplate.for_model(tokenizer, model_dir)


def build_server(opts: ServeOptions, cfg: EngineConfig, flags: dict | None = None,
                 cost=None) -> ServerState:
    """A ServerState ready for build_app; `flags` is the resolved flag table /server_info
    shows (commands/serve.py makes it); `cost`: the sim executor's cost model when the
    caller already built it (else sim_cost(opts))."""
    events_on = opts.kv_events.enable_kv_cache_events and cfg.cache.kind != "none"
    if events_on:
        cfg = cfg.with_(cache=dataclasses.replace(cfg.cache, enable_events=True))
    if opts.executor == "sim":
        from radixkv.sim.executor import SimExecutor
        cost = cost or sim_cost(opts)
        margs, make_sampling = cost.model_spec.model, None
        tokenizer, template = load_text(opts, margs.vocab_size)
        ex = SimExecutor(cost, output_ids=[i for i in tokenizer.encode(SIM_OUTPUT.decode())])
    else:
        ex, margs, make_sampling = _torch_parts(opts, cfg)
        tokenizer, template = load_text(opts, margs.vocab_size)
    max_len = min(opts.max_model_len or margs.max_seq_len, margs.max_seq_len)
    engine = Engine(cfg, cfg.cache.build(), ex)
    metrics = ServerMetrics(opts.name) if opts.enable_metrics else None
    if metrics is not None:
        metrics.cache_config(cfg.cache.page_size, cfg.kv_capacity // cfg.cache.page_size,
                             cfg.cache.hash_algo, cfg.cache.kind != "none")
    publisher = make_publisher(opts.kv_events, cfg.cache.page_size) if events_on else None
    if metrics is not None and publisher is not None:
        metrics.kv_events(publisher)
    worker = EngineWorker(engine, pace=opts.executor == "sim", metrics=metrics, publisher=publisher,
                          fault_after_steps=env.fault_after_steps())
    state = ServerState(
        worker=worker, tokenizer=tokenizer, template=template,
        model_name=opts.name, max_model_len=max_len, vocab_size=margs.vocab_size,
        eos_id=margs.eos_id if margs.eos_id is not None else tokenizer.eos_id,
        tenants=opts.tenants, allow_client_cache_salt=opts.allow_client_cache_salt,
        metrics=metrics, make_sampling=make_sampling, client_timeout=opts.client_timeout,
        max_request_bytes=opts.max_request_bytes)
    if publisher is not None:
        state.closers.append(publisher.close)
    cache_off = None
    if cfg.cache.kind == "none":
        given = (flags or {}).get("--disable-radix-cache", {}).get("source") == "flag"
        cache_off = ("--disable-radix-cache" if given else "--cache none") + \
            ": no prefix is cached; every prompt token is computed"
    state.info = {
        "version": __version__, "model": opts.name, "model_source": opts.model,
        "executor": ex.name, "max_model_len": max_len, "vocab_size": margs.vocab_size,
        "kv_capacity": cfg.kv_capacity, "cache": cfg.cache.label,
        "kv_hash": cfg.cache.hash_algo,              # the page hashes its KV events carry
        "cache_enabled": cache_off is None, "cache_disabled_reason": cache_off,
        "chat_template": state.template.name,
        "tokenizer": {"kind": "huggingface" if tokenizer_path(opts) else "bytes",
                      "path": tokenizer_path(opts), "vocab_size": tokenizer.vocab_size},
        "tenants": len(opts.tenants.keys), "shared_namespace": opts.tenants.shared_namespace,
        "allow_client_cache_salt": opts.allow_client_cache_salt,
        "metrics": opts.enable_metrics,
        "client_timeout": opts.client_timeout, "max_request_bytes": opts.max_request_bytes,
        "kv_events": {**dataclasses.asdict(opts.kv_events),
                      "endpoint": publisher.endpoint if publisher else None,
                      "replay_endpoint": publisher.replay_endpoint if publisher else None},
        "flags": flags or {},
    }
    return state
