"""`radixkv serve`: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

The same cache and scheduler flags as every other subcommand; the executor is a real model
(`--executor torch`) or the simulated GPU (`--executor sim`: real HTTP, real scheduler and
cache, the cost model's timing), so a laptop can stand in for a replica of a large model.
"""
from __future__ import annotations

import argparse
import sys
import threading
import traceback
from typing import Any

from radixkv.commands.flags import (CACHE_FLAGS, ENGINE_FLAGS, SCHED_FLAGS, add_config_flags,
                                    check_pool, configs_from_args)
from radixkv.commands.torch_flags import add_torch_flag
from radixkv.shapes import MODEL_CONFIGS
from radixkv.sim.specs import GPU_SPECS, MODEL_SPECS

TORCH_DEFAULT_TOKENS = 65536
SIM_DEFAULT_TOKENS = 400_000            # about what Llama-3-8B leaves for KV on an 80 GB GPU


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the engine over an OpenAI-compatible HTTP API",
        description="Serve /v1/completions and /v1/chat/completions (streaming and not, with "
                    "usage.prompt_tokens_details.cached_tokens), /v1/models, /health, "
                    "/server_info, /metrics and /flush_cache. Ctrl-C or SIGTERM stops it.")
    g = p.add_argument_group("model and executor")
    g.add_argument("--model", default="tiny-llama", metavar="NAME|DIR",
                   help=f"torch: a named shape with random weights ({', '.join(MODEL_CONFIGS)}) "
                        f"or a local Hugging Face checkpoint directory; sim: "
                        f"{', '.join(sorted(MODEL_SPECS))} (default: tiny-llama)")
    g.add_argument("--executor", choices=("torch", "sim"), default="torch",
                   help="torch: the real model; sim: the simulated GPU of radixkv simulate "
                        "(default: torch)")
    g.add_argument("--gpu", default="h100-sxm", choices=sorted(GPU_SPECS), metavar="NAME",
                   help=f"sim: the GPU of the cost model ({', '.join(sorted(GPU_SPECS))}; "
                        f"default: h100-sxm)")
    g.add_argument("--tp", type=int, metavar="N",
                   help="sim: tensor-parallel degree of the simulated model (default: the "
                        "model spec's)")
    g.add_argument("--profile", metavar="PROFILE.json",
                   help="sim: price steps with a `radixkv calibrate` profile of --model "
                        "instead of the named GPU")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="the model id of the API (default: --model)")
    g.add_argument("--max-model-len", "--context-length", type=int, metavar="N",
                   dest="max_model_len", help="context length (default: the model's)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json (default: the checkpoint's, else bytes)")
    add_torch_flag(g, "--device", scope="torch: ", default="cuda if present")
    add_torch_flag(g, "--dtype", scope="torch: ")
    add_torch_flag(g, "--threads", scope="torch: ")
    add_config_flags(p, caches="one", scheduler=True,
                     max_total_tokens=f"{TORCH_DEFAULT_TOKENS} for torch, {SIM_DEFAULT_TOKENS} "
                                      f"for sim")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000,
                   help="port to bind; 0 picks a free one (default: 8000)")
    g.add_argument("--enable-metrics", action="store_true",
                   help="serve Prometheus metrics at /metrics")
    g.add_argument("--kv-events-config", metavar="JSON",
                   help="KV cache events, with vLLM's keys, e.g. '{\"enable_kv_cache_events\": "
                        "true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://127.0.0.1:5557\", "
                        "\"replay_endpoint\": \"tcp://127.0.0.1:5558\", \"topic\": \"kv\"}'; "
                        "\"encoding\": \"array\" sends the older positional events instead of "
                        "vLLM's current tagged maps")
    g.add_argument("--api-keys", metavar="FILE",
                   help="JSON {\"keys\": {KEY: TENANT, ...}, \"shared_namespace\": NAME}: "
                        "requests need a key; each tenant's prefixes live in its own namespace")
    g.add_argument("--allow-client-cache-salt", action="store_true",
                   help="honour a request's cache_salt (inside its tenant's namespace)")
    add_client_limit_flags(g, "its request aborted")
    g.add_argument("--exit-on-engine-failure", action="store_true",
                   help="when the engine fails, answer the requests in flight with an error, "
                        "then exit with status 1 (for an orchestrator to restart it); without "
                        "it the server keeps answering 503 until stopped")
    g = p.add_argument_group("replicas (Ray Serve)")
    g.add_argument("--replicas", type=int, metavar="N",
                   help="serve N replicas of the engine on a local Ray cluster (Ray Serve), "
                        "behind one endpoint on --host:--port (default: one server, no Ray)")
    g.add_argument("--router", metavar="NAME",
                   help="with --replicas: the router that picks each request's replica, as in "
                        "`radixkv cluster` (default: radixkv)")
    g.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (default: warning)")
    p.set_defaults(func=run)


def add_client_limit_flags(g, dropped: str) -> None:
    """--client-timeout and --max-request-bytes (server/guard.py), for serve and route;
    `dropped`: what happens to a dropped reader's request."""
    from radixkv.server.guard import DEFAULT_CLIENT_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
    g.add_argument("--client-timeout", type=float, default=DEFAULT_CLIENT_TIMEOUT, metavar="S",
                   help=f"seconds a client has to send a request's headers, then its body "
                        f"(else 408), and to take each piece of a response; a client that stops "
                        f"reading is dropped and {dropped} (default: {DEFAULT_CLIENT_TIMEOUT:g})")
    g.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   metavar="N",
                   help=f"the largest request body; a larger one is answered 413 before it is "
                        f"parsed (default: {DEFAULT_MAX_REQUEST_BYTES}, "
                        f"{DEFAULT_MAX_REQUEST_BYTES >> 20} MiB)")


def flag_table(args: argparse.Namespace, cfg) -> dict:
    """Every configuration flag: its value in effect, its default, and where the value came
    from ("flag" when given on the command line, else "default")."""
    out: dict[str, dict] = {}
    for owner, table in ((cfg.cache, CACHE_FLAGS), (cfg.sched, SCHED_FLAGS), (cfg, ENGINE_FLAGS)):
        for name, cf in table.items():
            given = getattr(args, name, None) is not None
            out[cf.flag] = {"value": getattr(owner, name), "default": cf.default,
                            "source": "flag" if given else "default"}
    out["--disable-radix-cache"] = {"value": bool(args.disable_radix_cache), "default": False,
                                    "source": "flag" if args.disable_radix_cache else "default"}
    return out


def run(args: argparse.Namespace) -> int:
    from radixkv.kvevents.publisher import KVEventsConfig
    from radixkv.server.app import build_app
    from radixkv.server.build import ServeOptions, build_server
    from radixkv.server.launch import bind, serve_forever, url_of
    from radixkv.server.tenants import Tenants

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    try:
        events = KVEventsConfig() if args.kv_events_config is None else \
            KVEventsConfig.from_json(args.kv_events_config)
    except ValueError as e:
        raise ValueError(f"--kv-events-config: {e}") from None
    opts = ServeOptions(model=args.model, executor=args.executor, gpu=args.gpu,
                        served_model_name=args.served_model_name,
                        max_model_len=args.max_model_len, enable_metrics=args.enable_metrics,
                        kv_events=events,
                        tenants=Tenants.load(args.api_keys) if args.api_keys else Tenants(),
                        allow_client_cache_salt=args.allow_client_cache_salt,
                        device=args.device, dtype=args.dtype, threads=args.threads,
                        tokenizer=args.tokenizer, seed=args.seed or 0, tp=args.tp,
                        profile=args.profile, client_timeout=args.client_timeout,
                        max_request_bytes=args.max_request_bytes)
    cost = None
    if args.executor == "sim":
        from radixkv.server.build import sim_cost
        cost = sim_cost(opts)
        bpt, default = cost.model_spec.kv_bytes_per_token_per_gpu, SIM_DEFAULT_TOKENS
    else:
        bpt, default = None, TORCH_DEFAULT_TOKENS
    rc = configs_from_args(args, kv_bytes_per_token=bpt, default_tokens=default)
    cfg = rc.engine(rc.caches[0])
    check_pool(cfg)
    if args.replicas is not None and args.replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {args.replicas}")
    if args.router is not None and (args.replicas or 1) == 1:
        raise ValueError(f"--router {args.router} routes between replicas: give --replicas N "
                         f"with N > 1")
    if (args.replicas or 1) > 1:
        if args.exit_on_engine_failure:
            raise ValueError("--exit-on-engine-failure stops one server; with --replicas each "
                             "replica's failure is answered with 503 by that replica")
        return run_replicas(args, opts, cfg)
    sock = bind(args.host, args.port)            # before the model loads: a busy port fails fast
    try:
        state = build_server(opts, cfg, flag_table(args, cfg), cost=cost)
        url = url_of(sock)

        def ready() -> None:
            print(f"radixkv serve: listening on {url} ({state.info['executor']}, "
                  f"{state.info['cache']}, KV {cfg.kv_capacity:,} tokens)", flush=True)
        state.on_ready = ready
        failed = _on_engine_failure(state, args)
        serve_forever(build_app(state), sock, args.log_level,
                      drain=lambda: state.worker.close("the server is shutting down"),
                      exit_when=failed if args.exit_on_engine_failure else None,
                      client_timeout=opts.client_timeout)
    finally:
        sock.close()
    if args.exit_on_engine_failure and failed.is_set():
        print(f"radixkv serve: {state.worker.error}; exiting", file=sys.stderr, flush=True)
        return 1
    print("radixkv serve: stopped", file=sys.stderr, flush=True)
    return 0


def _on_engine_failure(state, args: argparse.Namespace) -> threading.Event:
    """An engine failure is reported once: with --exit-on-engine-failure the returned event
    stops the server (run then says why and returns 1); without it one line says the server
    answers 503 from now on. --log-level debug adds the traceback."""
    failed = threading.Event()

    def on_failure(exc: BaseException) -> None:
        if args.log_level == "debug":
            traceback.print_exception(exc)
        if not args.exit_on_engine_failure:
            print(f"radixkv serve: {state.worker.error}; answering 503 until stopped",
                  file=sys.stderr, flush=True)
        failed.set()
    state.worker.on_failure = on_failure
    return failed


def run_replicas(args: argparse.Namespace, opts, cfg) -> int:
    """--replicas N: a local Ray cluster, N engine replicas behind Ray Serve's proxy, routed
    by --router; until SIGINT / SIGTERM."""
    import signal

    from radixkv.rayserve.ingress import HUB, check_options, ray_serve
    from radixkv.rayserve.request_router import router_config

    name = args.router or "radixkv"
    check_options(opts, args.replicas)
    config, events = router_config(name, args.replicas, opts, cfg, HUB)
    stop = threading.Event()

    def on_signal(*_) -> None:
        stop.set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    with ray_serve(opts, cfg, args.replicas, config, events=events, host=args.host,
                   port=args.port, flags=flag_table(args, cfg),
                   verbose=args.log_level in ("info", "debug")) as url:
        for sig in (signal.SIGINT, signal.SIGTERM):    # again: ray.init took SIGTERM
            signal.signal(sig, on_signal)
        print(f"radixkv serve: listening on {url} ({args.replicas} replicas on Ray Serve, "
              f"router {name}, {opts.executor}, KV {cfg.kv_capacity:,} tokens each; "
              f"GET {url}/replicas lists them)", flush=True)
        stop.wait()
    print("radixkv serve: stopped", file=sys.stderr, flush=True)
    return 0
