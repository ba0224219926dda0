"""The gateway's hot path: the generation routes as a bare ASGI middleware, and a worker's
streamed response relayed to the client.

`GenerationRoutes` sits inside the request guard (server/guard.py) and takes every request to
`/v1/completions` and `/v1/chat/completions` before FastAPI's router does: no route matching,
no endpoint machinery, no exception wrappers around each write. A streamed response is relayed
chunk by chunk as aiohttp reads it (each read: whatever the worker's socket holds), one ASGI
send each (benchmarks/RESULTS.md, `bench_relay.py`: what a relayed event costs).

While a stream is relayed one task waits for the client's disconnect (uvicorn's send is silent
once the client is gone): when it comes, the upstream response is closed, which the worker
aborts. However the relay ends, the worker's connection is released (read to its end) or closed
(not), and the router is told the request finished.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import NamedTuple

import aiohttp
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

from radixkv.gateway.workers import WORKER_ERRORS
from radixkv.router import RequestInfo

log = logging.getLogger(__name__)
GENERATION = {"/v1/completions": False, "/v1/chat/completions": True}   # path -> chat
TAIL = 4096                     # bytes of a stream kept for its usage (the last event holds it)


def error(status: int, message: str, kind: str = "server_error") -> JSONResponse:
    """An error in OpenAI's body."""
    return JSONResponse({"object": "error", "error": {"message": message, "type": kind,
                                                     "param": None, "code": status}}, status)


class Upstream(NamedTuple):
    """A worker's streamed response, headers read, its body still to relay."""
    resp: aiohttp.ClientResponse
    info: RequestInfo
    worker: str


class GenerationRoutes:
    """ASGI middleware: a request to a generation route goes to the gateway, the rest to `app`."""

    def __init__(self, app, gateway):          # a proxy.Gateway
        self.app, self.gw = app, gateway

    async def __call__(self, scope, receive, send) -> None:
        chat = GENERATION.get(scope["path"]) if scope["type"] == "http" else None
        if chat is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await error(405, "Method Not Allowed", "invalid_request_error")(scope, receive, send)
            return
        out = await self.gw.generate(HTTPRequest(scope, receive), scope["path"], chat)
        if isinstance(out, Upstream):
            await relay(self.gw, out, receive, send)
        else:
            await out(scope, receive, send)


async def relay(gw, up: Upstream, receive, send) -> None:
    """Relay `up` to the client for `gw` (the proxy.Gateway that sent it)."""
    resp, info, worker = up
    gone = False

    async def listen() -> None:               # the client's hang-up closes the upstream request
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        resp.close()

    gw.relays.add(resp)
    listener = asyncio.create_task(listen())
    try:
        await send({"type": "http.response.start", "status": resp.status, "headers": [
            (b"content-type", resp.headers.get("content-type",
                                               "text/event-stream; charset=utf-8").encode())]})
        first, tail, head = True, b"", b""
        try:
            async for chunk in resp.content.iter_any():
                if first:                  # until the first content (a chat's role chunk is not)
                    head += chunk
                    if has_content(head):
                        first = False
                        now = time.monotonic()
                        gw.metrics.ttft.observe(now - info.arrival)
                        gw.routing.first_output(info.rid, now)
                tail = (tail + chunk)[-TAIL:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except WORKER_ERRORS as e:                # the worker failed after the first byte
            if gone:                              # ...or the client left and closed it
                return
            if gw.closing is not None:            # ...or drain() cut it
                err = {"object": "error", "error": {"message": gw.closing, "param": None,
                                                    "type": "server_error", "code": 503}}
            else:
                log.warning("%s: worker %s failed mid-stream (%s): ended with an error event",
                            info.rid, worker, type(e).__name__)
                gw.metrics.errors.labels("midstream").inc()
                err = {"error": {"message": f"the worker failed mid-stream: {type(e).__name__}",
                                 "type": "server_error", "code": 502}}
            tail = f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return
        if not gone:
            gw.reported(tail)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        listener.cancel()
        gw.relays.discard(resp)
        if resp.content.is_eof():
            resp.release()                        # relayed to its end: the connection is kept
        else:
            resp.close()                          # a client gone: the worker aborts
        gw.routing.finished(info.rid)


def has_content(head: bytes) -> bool:
    """Whether the server-sent events in `head` (the stream so far) hold generated content: a
    completion's text, a chat delta's content or reasoning, or the stream's end."""
    for line in head.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return True
        try:
            obj = json.loads(data)
        except ValueError:                     # a line cut across chunks: wait for the rest
            continue
        if not isinstance(obj, dict):
            continue
        choices = obj.get("choices")
        for c in choices if isinstance(choices, list) else ():
            if not isinstance(c, dict):
                continue
            delta = c.get("delta") if isinstance(c.get("delta"), dict) else {}
            if c.get("text") or delta.get("content") or delta.get("reasoning_content") \
                    or c.get("finish_reason"):
                return True
        if "error" in obj:
            return True
    return len(head) > 65536                   # no content in 64 KiB: count it as begun
