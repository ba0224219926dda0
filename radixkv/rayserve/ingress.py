"""`radixkv serve --replicas N` on Ray Serve: N engine replicas (radixkv.rayserve.replica)
behind one OpenAI endpoint, Ray Serve's HTTP proxy on HOST:PORT.

The proxy sends every HTTP request to one ingress replica (FastAPI). For a completion or chat
request the ingress computes what a router needs — the prompt's token ids exactly as a replica
will (the same tokenizer, chat template and tenant namespace), a routing key, the output budget
— and calls the engine deployment through a Ray Serve handle with that `route` as the first
argument; the deployment's request router (configured by the caller: radixkv.rayserve.request_router)
reads it in `choose_replicas`. Every other route goes to any replica. `GET /replicas` lists the
replicas: id, rank, loopback URL (each replica's own /metrics and /server_info), process id and
engine figures, and under `router` what the request router knows of each rank
(request_router.RouterAdapter.state; null before the first routed request).

A replica that dies (its process killed) fails what it was serving: before the first byte the
request is sent once more (Ray Serve chooses among the live replicas), then it is a 502 error
body; after it, a stream ends with an error event and `data: [DONE]`, any other response is cut
short. Ray Serve starts a replacement, which takes the dead replica's rank.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import uuid
from types import SimpleNamespace

import ray
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.exceptions import RayActorError, RayError

from radixkv.config import EngineConfig
from radixkv.kvevents.publisher import KVEventsConfig
from radixkv.rayserve.replica import HUB_NAMESPACE, EngineReplica, EventHub, hub_named
from radixkv.rayserve.request_router import ADAPTERS
from radixkv.server import protocol as P
from radixkv.server.state import APIError, prompt_ids
from radixkv.server.build import ServeOptions, load_text
from radixkv.server.launch import bind
from radixkv.server.tenants import AuthError
from radixkv.argcheck import positive_int

APP = "radixkv"
ENGINE = "engine"
HUB = "radixkv-hub"
ROUTED = {"v1/completions": False, "v1/chat/completions": True}    # path -> chat
NO_VOCAB_CHECK = 2**31          # the replica checks token ids; the ingress only routes
QUIET = {"log_level": "WARNING", "enable_access_log": False}
DRAIN_S = 4.0                   # at shutdown: how long requests in flight may still run
log = logging.getLogger(__name__)


def failure(message: str) -> dict:
    return {"object": "error", "error": {"message": message, "type": "server_error",
                                         "param": None, "code": 502}}


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
        router = ADAPTERS.get(hub_name)
        return {"replicas": sorted(listed.values(), key=lambda r: r["rank"]),
                "router": router.state() if router is not None else None}

    async def send(path: str, target: str, raw: HTTPRequest, body: bytes):
        """(the replica's response generator, status, headers), or what failed before the
        first byte: a replica that died gets the request sent once more."""
        for attempt in (1, 2):
            gen = engine.forward.remote(route_of(text, opts, path, raw, body), raw.method,
                                        target, list(raw.headers.items()), body)
            try:
                status, headers = await gen.__anext__()
                return gen, status, headers
            except RayActorError as e:
                log.warning("%s %s: its replica died before the first byte (%s)%s", raw.method,
                            target, type(e).__name__, "; sent once more" if attempt == 1 else "")
                failed = f"the replica serving it died twice ({type(e).__name__})"
            except RayError as e:
                log.warning("%s %s failed before the first byte: %s", raw.method, target, e)
                return f"the replica failed it ({type(e).__name__})"
        return failed

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def relay(path: str, raw: HTTPRequest):
        body, query = await raw.body(), raw.url.query
        target = f"/{path}?{query}" if query else f"/{path}"
        sent = await send(path, target, raw, body)
        if isinstance(sent, str):
            return JSONResponse(failure(sent), 502)
        gen, status, headers = sent
        sse = "event-stream" in dict(headers).get("content-type", "")

        async def rest():
            done = False
            try:
                async for chunk in gen:
                    yield chunk
                done = True
            except RayError as e:               # the replica died (or failed) mid-response
                done = True
                log.warning("%s %s: its replica failed mid-response (%s)", raw.method, target,
                            type(e).__name__)
                if not sse:
                    raise                       # cut short: the client sees it unfinished
                msg = failure(f"the replica failed mid-stream: {type(e).__name__}")
                yield f"data: {json.dumps(msg)}\n\ndata: [DONE]\n\n".encode()
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


def init_ray(verbose: bool = False) -> None:
    """A local Ray cluster on 127.0.0.1, its logging quiet unless `verbose`."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"          # the workers inherit it
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")   # no GPU is asked for
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             _node_ip_address="127.0.0.1", namespace=HUB_NAMESPACE, log_to_driver=verbose,
             logging_level=logging.INFO if verbose else logging.ERROR)
    logging.getLogger("ray.serve").setLevel(logging.INFO if verbose else logging.ERROR)


def start_proxy(host: str, port: int, tries: int = 3) -> int:
    """serve.start with its proxy on host:port; returns the port. Port 0: a free one, chosen
    again (up to `tries` times) when another process binds it first: it is free when chosen but
    bound only later, by the proxy actor, while Ray's own processes take ports of their own."""
    attempt = 1
    while True:
        chosen = port or free_port(host)
        try:
            serve.start(http_options={"host": host, "port": chosen}, logging_config=QUIET)
            return chosen
        except RayError as e:
            if port or attempt >= tries or "Failed to bind" not in str(e):
                raise
        attempt += 1
        serve.shutdown()                  # else the next start keeps the first's http options


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
              events: bool, host: str = "127.0.0.1", port: int = 0, flags: dict | None = None,
              verbose: bool = False):
    """A local Ray cluster serving N replicas behind Ray Serve's proxy on host:port (0: a
    free one); yields the base URL; Serve and Ray are shut down however the block ends: the
    app first, its requests in flight given DRAIN_S to finish (a stream still running then
    ends with an error event), then Serve and Ray. `router_config` is the engine deployment's
    RequestRouterConfig; `events`: replicas send KV events (the router reads them);
    `verbose`: Ray's and Serve's info lines and the replicas' log lines on this process's
    stderr too (else the replicas' lines go only to Ray's log files, and Ray and Serve here
    say only errors)."""
    check_options(opts, replicas)
    if events:
        opts = dataclasses.replace(opts, kv_events=KVEventsConfig(enable_kv_cache_events=True))
    if port:
        bind(host, port).close()                 # a busy port fails here, naming it
    init_ray(verbose)
    try:
        hub = EventHub.options(name=HUB, namespace=HUB_NAMESPACE).remote()    # kept: it lives
        ray.get(hub.replicas.remote())                                        # while held
        port = start_proxy(host, port)
        engine = serve.deployment(EngineReplica, name=ENGINE, num_replicas=replicas,
                                  max_ongoing_requests=1024, request_router_config=router_config,
                                  ray_actor_options={"num_cpus": 0}, **_graceful(DRAIN_S))
        front = serve.deployment(ingress(opts, HUB), name="ingress", num_replicas=1,
                                 max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0},
                                 **_graceful(DRAIN_S + 3))     # outlives the engine's drain
        serve.run(front.bind(engine.bind(opts, cfg, HUB, events, flags)), name=APP,
                  route_prefix="/", logging_config=QUIET)
        yield f"http://{host}:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP)            # the proxy stays up while the replicas drain
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def _graceful(timeout: float) -> dict:
    """A replica being stopped waits for its requests up to `timeout` s, checking often."""
    return {"graceful_shutdown_timeout_s": timeout, "graceful_shutdown_wait_loop_s": 0.2}
