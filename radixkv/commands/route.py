"""`radixkv route`: the cache-aware gateway in front of any OpenAI-compatible fleet (radixkv,
vLLM or SGLang workers), with any router of `radixkv cluster` (radixkv.gateway)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from radixkv.commands.serve import add_client_limit_flags
from radixkv.kvevents.hashes import ROUTE_HASHES
from radixkv.router import ROUTERS
from radixkv.sim.specs import GPU_SPECS, MODEL_SPECS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "route", help="a cache-aware gateway in front of OpenAI-compatible workers",
        description="Proxy /v1/completions and /v1/chat/completions (streamed as they arrive) "
                    "to the worker a router of `radixkv cluster` picks, from the workers' KV "
                    "events (--kv-events) or, without them, from what the gateway sent; serve "
                    "/v1/models, /health, /metrics and /workers (GET, POST, DELETE /workers/URL).")
    p.add_argument("--worker-urls", nargs="+", required=True, metavar="URL",
                   help="the workers' base URLs")
    p.add_argument("--router", default="radixkv", choices=ROUTERS.names(), metavar="NAME",
                   help=f"{', '.join(ROUTERS.names())} (default: radixkv)")
    p.add_argument("--kv-events", action="append", default=[], metavar="URL=tcp://H:P[,tcp://H:P]",
                   help="a worker's KV event PUB socket and, optionally, its replay socket "
                        "(repeatable; vLLM's current or older encoding)")
    p.add_argument("--kv-events-bind", action="append", default=[],
                   metavar="URL=tcp://H:P[,tcp://H:P]",
                   help="as --kv-events, for a worker whose publisher connects to that address "
                        "(vLLM's, given a concrete tcp endpoint such as tcp://127.0.0.1:5557): "
                        "the gateway binds it (repeatable)")
    p.add_argument("--kv-hash", choices=ROUTE_HASHES, metavar="NAME",
                   help=f"the page hashes the workers' KV events carry ({', '.join(ROUTE_HASHES)}; "
                        f"default: what each worker says: radixkv's /server_info, vLLM's "
                        f"prefix_caching_hash_algo, so vllm-sha256 or vllm-sha256-cbor)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="tokenize locally with the workers' tokenizer (default: ask the workers' "
                        "/tokenize)")
    p.add_argument("--model", metavar="NAME",
                   help=f"the radixkv routers' step cost: the served model "
                        f"({', '.join(sorted(MODEL_SPECS))}); radixkv-fit, which fits each "
                        f"worker's TTFT online to the TTFTs the gateway measures, rescales it and "
                        f"takes llama-3-8b without one")
    p.add_argument("--gpu", default="h100-sxm", choices=sorted(GPU_SPECS), metavar="NAME",
                   help="the workers' GPU for that step cost (default: h100-sxm)")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="price steps with a `radixkv calibrate` profile instead")
    p.add_argument("--approx-ttl", type=float, default=120.0, metavar="S",
                   help="without KV events: seconds a sent prefix counts as held (default: 120)")
    p.add_argument("--health-interval", type=float, default=2.0, metavar="S",
                   help="seconds between health checks of each worker (default: 2)")
    p.add_argument("--router-option", action="append", default=[], metavar="ROUTER.FIELD=VALUE",
                   help="set one of the router's options (repeatable), e.g. "
                        "radixkv.decode_weight=1")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="randomised routers (default: 0)")
    add_client_limit_flags(p, "its upstream request closed")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port; 0 picks a free one (default: 30000)")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def build(args: argparse.Namespace):
    """The gateway's app from the command line (every input checked before anything starts)."""
    from radixkv.gateway.core import Routing
    from radixkv.gateway.proxy import Gateway, build_gateway_app, parse_events_value
    from radixkv.gateway.tokens import Tokens

    events = {}
    for flag, specs in (("--kv-events", args.kv_events), ("--kv-events-bind", args.kv_events_bind)):
        for spec in specs:
            url, sep, where = spec.partition("=")
            if not sep or url.rstrip("/") not in [u.rstrip("/") for u in args.worker_urls]:
                raise ValueError(f"{flag} {spec!r}: expected URL=tcp://HOST:PORT with URL one "
                                 f"of --worker-urls")
            if url.rstrip("/") in events:
                raise ValueError(f"{flag} {spec!r}: worker {url} has KV events already")
            events[url.rstrip("/")] = parse_events_value(where, flag == "--kv-events-bind")
    if not args.approx_ttl > 0:
        raise ValueError(f"--approx-ttl {args.approx_ttl!r} is not a positive number of seconds")
    cost = None
    if args.profile is not None:
        from radixkv.sim.profile import load_profile
        cost = load_profile(args.profile).cost_model()
    elif args.model is not None:
        from radixkv.sim.measured import named_cost
        cost = named_cost(args.model, args.gpu)
    elif args.router == "radixkv-fit":            # the features' shape; the fit rescales it
        from radixkv.sim.costmodel import CostModel
        cost = CostModel.named("llama-3-8b", args.gpu)
    elif args.router == "radixkv":
        raise ValueError("--router radixkv prices each worker's queue: give --model NAME (and "
                         "--gpu) or --profile FILE, or take --router radixkv-fit")
    from radixkv.router.options import parse_router_options
    options = parse_router_options(args.router_option, [args.router]).get(args.router)
    routing = Routing(args.router, events=events, cost=cost, seed=args.seed,
                      sent_ttl=args.approx_ttl, hash_algo=args.kv_hash, options=options)
    tokens = Tokens(args.tokenizer)
    return build_gateway_app(Gateway(args.worker_urls, routing, tokens,
                                     health_interval=args.health_interval,
                                     client_timeout=args.client_timeout,
                                     max_request_bytes=args.max_request_bytes))


def run(args: argparse.Namespace) -> int:
    from radixkv.server.launch import bind, serve_forever, url_of

    app = build(args)
    sock = bind(args.host, args.port)
    print(f"radixkv route: listening on {url_of(sock)}", flush=True)
    serve_forever(app, sock, args.log_level, drain=app.state.gateway.drain,
                  client_timeout=app.state.gateway.client_timeout)
    print("radixkv route: stopped", file=sys.stderr, flush=True)
    return 0
