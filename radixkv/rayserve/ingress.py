"""`radixkv serve --replicas N` on Ray Serve: N engine replicas (radixkv.rayserve.replica)
behind one OpenAI endpoint, Ray Serve's HTTP proxy on HOST:PORT.

The proxy sends every HTTP request to one ingress replica (FastAPI). For a completion or chat
request the ingress computes what a router needs — the prompt's token ids exactly as a replica
will (the same tokenizer, chat template and tenant namespace), a routing key, the output budget
— and calls the engine deployment through a Ray Serve handle with that `route` as the first
argument; the deployment's request router (configured by the caller: radixkv.rayserve.request_router)
reads it in `choose_replicas`. Every other route goes to any replica. `GET /replicas` lists the
replicas: rank, loopback URL (each replica's own /metrics and /server_info) and engine figures.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from types import SimpleNamespace

import ray
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from ray import serve

from radixkv.config import EngineConfig
from radixkv.kvevents.publisher import KVEventsConfig
from radixkv.rayserve.replica import HUB_NAMESPACE, EngineReplica, EventHub, hub_named
from radixkv.server import protocol as P
from radixkv.server.state import APIError, prompt_ids
from radixkv.server.build import ServeOptions, load_text
from radixkv.server.launch import bind
from radixkv.server.tenants import AuthError
from radixkv.validate import positive_int

APP = "radixkv"
ENGINE = "engine"
HUB = "radixkv-hub"
ROUTED = {"v1/completions": False, "v1/chat/completions": True}    # path -> chat
NO_VOCAB_CHECK = 2**31          # the replica checks token ids; the ingress only routes
QUIET = {"log_level": "WARNING", "enable_access_log": False}


def route_of(text, opts: ServeOptions, path: str, raw: HTTPRequest, body: bytes) -> dict | None:
    """What the request router needs of a generation request; None for anything else, and for
    a request a replica will refuse (it answers with the error)."""
    if path not in ROUTED:
        return None
    chat = ROUTED[path]
    try:
        req = (P.ChatCompletionRequest if chat else P.CompletionRequest).model_validate_json(body)
        ids = prompt_ids(text, req, chat)
        tenant = opts.tenants.tenant_of(raw.headers.get("authorization"))
        salt = opts.tenants.cache_salt(tenant, req.cache_scope, req.cache_salt,
                                       opts.allow_client_cache_salt)
    except (ValidationError, APIError, AuthError, ValueError):
        return None
    if not ids:
        return None
    return {"rid": uuid.uuid4().hex, "tokens": ids, "namespace": (None, salt),
            "session": req.user, "max_new_tokens": req.limit() or req.default_max_tokens}


def front_app(opts: ServeOptions, hub_name: str) -> FastAPI:
    """The ingress's app (built inside its replica): /replicas, and every other route relayed
    to an engine replica."""
    tokenizer, template = load_text(opts)
    text = SimpleNamespace(tokenizer=tokenizer, template=template, vocab_size=NO_VOCAB_CHECK)
    engine = serve.get_deployment_handle(ENGINE, app_name=APP).options(stream=True)
    app = FastAPI(title="radixkv (Ray Serve)")

    @app.get("/replicas")
    async def replicas():
        listed = await hub_named(hub_name).replicas.remote()
        return {"replicas": sorted(listed.values(), key=lambda r: r["rank"])}

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def relay(path: str, raw: HTTPRequest):
        body, query = await raw.body(), raw.url.query
        gen = engine.forward.remote(route_of(text, opts, path, raw, body), raw.method,
                                    f"/{path}?{query}" if query else f"/{path}",
                                    list(raw.headers.items()), body)
        status, headers = await gen.__anext__()

        async def rest():
            done = False
            try:
                async for chunk in gen:
                    yield chunk
                done = True
            finally:
                if not done:                # the client went away: the replica aborts
                    gen.cancel()
        return StreamingResponse(rest(), status_code=status, headers=dict(headers))
    return app


def ingress(opts: ServeOptions, hub_name: str):
    """The ingress deployment's class: Ray Serve builds front_app in the replica."""
    def build() -> FastAPI:
        return front_app(opts, hub_name)
    return serve.ingress(build)()


def free_port(host: str) -> int:
    with bind(host, 0) as s:
        return s.getsockname()[1]


def check_options(opts: ServeOptions, replicas: int) -> None:
    """Refuses, naming the value, what N replicas on one machine cannot do."""
    positive_int(replicas, "--replicas")
    if opts.executor == "torch" and opts.device not in (None, "cpu"):
        raise ValueError(f"--replicas {replicas} runs each replica's model on the CPU; "
                         f"--device {opts.device} is not supported with --replicas")
    if opts.kv_events.enable_kv_cache_events and opts.kv_events.publisher != "null":
        raise ValueError("--kv-events-config with --replicas: the replicas send their KV "
                         "events to the router; a ZMQ publisher serves one server")


@contextlib.contextmanager
def ray_serve(opts: ServeOptions, cfg: EngineConfig, replicas: int, router_config, *,
              events: bool, host: str = "127.0.0.1", port: int = 0, flags: dict | None = None):
    """A local Ray cluster serving N replicas behind Ray Serve's proxy on host:port (0: a
    free one); yields the base URL; Serve and Ray are shut down however the block ends.
    `router_config` is the engine deployment's RequestRouterConfig; `events`: replicas send
    KV events (the router reads them)."""
    check_options(opts, replicas)
    if events:
        opts = dataclasses.replace(opts, kv_events=KVEventsConfig(enable_kv_cache_events=True))
    if port:
        bind(host, port).close()                 # a busy port fails here, naming it
    port = port or free_port(host)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"          # the workers inherit it
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")   # no GPU is asked for
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             _node_ip_address="127.0.0.1", namespace=HUB_NAMESPACE)
    try:
        hub = EventHub.options(name=HUB, namespace=HUB_NAMESPACE).remote()    # kept: it lives
        ray.get(hub.replicas.remote())                                        # while held
        serve.start(http_options={"host": host, "port": port}, logging_config=QUIET)
        engine = serve.deployment(EngineReplica, name=ENGINE, num_replicas=replicas,
                                  max_ongoing_requests=1024, request_router_config=router_config,
                                  ray_actor_options={"num_cpus": 0})
        front = serve.deployment(ingress(opts, HUB), name="ingress", num_replicas=1,
                                 max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
        serve.run(front.bind(engine.bind(opts, cfg, HUB, events, flags)), name=APP,
                  route_prefix="/", logging_config=QUIET)
        yield f"http://{host}:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
