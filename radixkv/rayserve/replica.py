"""One replica of `radixkv serve --replicas N` on Ray Serve, and the hub through which the
replicas tell the router what they hold.

A replica is the server of `radixkv serve`, unchanged: `build_server` (its Engine on its own
EngineWorker thread) and `build_app`, served by uvicorn on a loopback port inside the replica's
Ray actor. Its deployment method `forward` relays one HTTP exchange to that server and streams
the response back, so every route, check and error body is app.py's.

The hub is one named Ray actor (`EventHub`). Every replica registers with it (its Ray replica
id, its rank, its loopback URL), then appends to one ordered log: its cache's KV events as
vLLM wire batches (msgpack `[ts, [events], dp_rank]`, sent from the engine thread after each
step), and a notice when a routed request's first output reaches it (`first`) and when its
response ends (`finish`). Its engine figures (running requests, KV slots used) are polled every
POLL_S and kept as the latest value. A router reads everything new with one `pull(cursor)`, and
tells the hub of a replica that died (`dropped`): the listing (`GET /replicas`: id, rank, URL,
process id, figures) names live replicas only.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from itertools import islice
from typing import Any

import httpx
import ray
from ray import serve

from radixkv.config import EngineConfig
from radixkv.kvevents.wire import encode_batch, to_wire
from radixkv.server.app import build_app
from radixkv.server.build import ServeOptions, build_server
from radixkv.server.launch import ServerThread

HUB_NAMESPACE = "radixkv"
POLL_S = 0.02                  # engine figures: how often a replica reads them
LOG_ITEMS = 200_000            # hub log entries kept for a router that falls behind
_HOP = {"host", "content-length", "transfer-encoding", "connection"}


@ray.remote(num_cpus=0)
class EventHub:
    """The replicas' ordered log of KV event batches and request notices, their engine
    figures and their addresses."""

    def __init__(self) -> None:
        self._log: deque[tuple[str, str, Any]] = deque(maxlen=LOG_ITEMS)
        self._end = 0                             # absolute position after the last entry
        self._figures: dict[str, dict] = {}
        self._replicas: dict[str, dict] = {}

    def register(self, uid: str, rank: int, url: str, pid: int) -> None:
        """A replica takes `rank`; one that held it before (it died and was replaced) is
        forgotten, so exactly one replica is listed per rank."""
        for old in [u for u, r in self._replicas.items() if r["rank"] == rank and u != uid]:
            self.dropped(old)
        self._replicas[uid] = {"id": uid, "rank": rank, "url": url, "pid": pid}

    def dropped(self, uid: str) -> None:
        """A replica died (a router saw it): it is listed no more."""
        self._replicas.pop(uid, None)
        self._figures.pop(uid, None)

    def push(self, uid: str, kind: str, payload: Any) -> None:
        self._log.append((uid, kind, payload))
        self._end += 1

    def figures(self, uid: str, figures: dict) -> None:
        self._figures[uid] = figures

    def replicas(self) -> dict[str, dict]:
        return {uid: {**r, **self._figures.get(uid, {})} for uid, r in self._replicas.items()}

    def pull(self, cursor: int) -> dict:
        """Log entries from absolute position `cursor` on; `lost` counts the entries that were
        dropped before the reader got them."""
        start = self._end - len(self._log)
        return {"items": list(islice(self._log, max(cursor - start, 0), None)), "next": self._end,
                "lost": max(start - cursor, 0), "replicas": self.replicas()}


def hub_named(name: str):
    return ray.get_actor(name, namespace=HUB_NAMESPACE)


class HubPublisher:
    """The worker's KV event publisher: each step's events, as one wire batch, to the hub."""
    endpoint: str | None = None
    replay_endpoint: str | None = None

    def __init__(self, hub, uid: str, page_size: int):
        self.hub, self.uid, self.page_size = hub, uid, page_size

    def publish(self, events) -> None:
        wire = to_wire(events, self.page_size)
        if wire:
            self.hub.push.remote(self.uid, "events", encode_batch(time.time(), wire))

    def close(self) -> None:
        pass


def engine_figures(eng) -> dict:
    """What a replica publishes of its engine (called on the engine thread)."""
    return {"running": eng.sched.num_admitted, "kv_used": eng.pool.used(),
            "kv_capacity": eng.pool.num_slots}


class FirstOutput:
    """Reads an SSE response as it passes and says when the first event with output text (or
    a finish) goes by: the request's prefill is done."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> bool:
        self._buf += chunk
        *events, self._buf = self._buf.split(b"\n\n")
        for ev in events:
            data = ev.removeprefix(b"data: ")
            if data == ev or data == b"[DONE]":
                continue
            choice = (json.loads(data).get("choices") or [{}])[0]
            if choice.get("text") or (choice.get("delta") or {}).get("content") \
                    or choice.get("finish_reason"):
                return True
        return False


class EngineReplica:
    """The body of the engine deployment (Ray Serve makes one per replica)."""

    def __init__(self, opts: ServeOptions, cfg: EngineConfig, hub_name: str, events: bool,
                 flags: dict | None = None):
        self._stop, self.server = threading.Event(), None
        ctx = serve.get_replica_context()
        self.uid, self.rank = ctx.replica_id.unique_id, ctx.rank.rank
        self.hub = hub_named(hub_name)
        self.state = build_server(opts, cfg, flags)
        if events and self.state.worker.publisher is not None:      # None: --cache none
            self.state.worker.publisher = HubPublisher(self.hub, self.uid, cfg.cache.page_size)
        self.server = ServerThread(build_app(self.state), client_timeout=opts.client_timeout)
        self.url = self.server.__enter__()
        self.hub.register.remote(self.uid, self.rank, self.url, os.getpid())
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)
        threading.Thread(target=self._poll, name="radixkv-figures", daemon=True).start()

    def _poll(self) -> None:
        last = None
        while not self._stop.wait(POLL_S):
            try:
                figures = self.state.worker.call(engine_figures).result(timeout=30)
            except Exception:                       # the engine stopped: /health says why
                return
            if figures != last:
                self.hub.figures.remote(self.uid, figures)
                last = figures

    async def forward(self, route: dict | None, method: str, path: str,
                      headers: list[tuple[str, str]], body: bytes):
        """Relay one HTTP exchange to this replica's server: yields (status, headers), then
        the response body in chunks. A routed request's notices go to the hub."""
        rid = route["rid"] if route else None
        sent = [(k, v) for k, v in headers if k.lower() not in _HOP]
        try:
            async with self.client.stream(method, path, headers=sent, content=body) as resp:
                yield resp.status_code, [(k, v) for k, v in resp.headers.items()
                                         if k.lower() not in _HOP]
                sse = FirstOutput() if "event-stream" in resp.headers.get("content-type", "") \
                    else None
                async for chunk in resp.aiter_raw():
                    if rid is not None and sse is not None and sse.feed(chunk):
                        self.hub.push.remote(self.uid, "first", rid)
                        sse = None
                    yield chunk
        finally:
            if rid is not None:
                self.hub.push.remote(self.uid, "finish", rid)

    def __del__(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.stop()
