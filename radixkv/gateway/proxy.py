"""The gateway's HTTP side: a streaming proxy for `/v1/completions` and `/v1/chat/completions`
(each request routed by `core.Routing`; server-sent events passed through as they arrive; a
client that hangs up closes the upstream request, which the worker then aborts), `/v1/models`,
`/health`, `/metrics` (the gateway's own), and the fleet at run time: `GET /workers`,
`POST /workers` (`{"url": ..., "kv_events": "tcp://H:P[,tcp://H:P]"}`), `DELETE /workers/{url}`.

Faults: a worker that refuses the connection, times out or answers 5xx before the first byte
gets the request retried once on the next best worker (the same one when it is the only one
left: its pooled connection may have been closed under it); a failure after the first byte
ends the stream with an error event. A worker's 4xx reaches the client unchanged. A request
body is forwarded as it came. Bad input is a 400 that changes nothing: a body that is not a JSON
object, prompt token ids no page hash can take, a worker URL that does not answer as a worker.
Hostile clients meet the server's guard (server/guard.py): a body over `max_request_bytes` is a
413 before it is parsed or sent on, a body or a response write slower than `client_timeout` a
408 or a dropped connection (its upstream request closed).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from contextlib import asynccontextmanager

import aiohttp
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixkv.gateway.bridge import BridgedResponse
from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.metrics import GatewayMetrics
from radixkv.gateway.tokens import TokenizeError, Tokens
from radixkv.gateway.upstream import Reply, Upstream
from radixkv.gateway.workers import WORKER_ERRORS, Worker, check_health, discover, every, scrape
from radixkv.router import RequestInfo
from radixkv.server.guard import DEFAULT_CLIENT_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, RequestGuard
from radixkv.argcheck import positive_int, positive_number

log = logging.getLogger(__name__)
_ids = itertools.count()
DEFAULT_MAX_TOKENS = {False: 16, True: 128}           # what the OpenAI servers default to
PASSED_HEADERS = ("authorization", "x-request-id")
# a prompt up to this many tokens is routed on the event loop (a few ms); a longer one on a
# thread. A thread hop saves nothing under the GIL and, with the loop busy relaying, waits
# out its switch interval: it tripled the routing time of 4,000-token prompts under load
INLINE_TOKENS = 32_768


def _error(status: int, message: str, kind: str = "server_error") -> JSONResponse:
    return JSONResponse({"object": "error", "error": {"message": message, "type": kind,
                                                     "param": None, "code": status}}, status)


class Gateway:
    def __init__(self, urls: list[str], routing: Routing, tokens: Tokens, *,
                 health_interval: float = 2.0, scrape_interval: float = 0.5,
                 failures_to_leave: int = 2, timeout: float = 600.0,
                 client_timeout: float = DEFAULT_CLIENT_TIMEOUT,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        if not urls:
            raise ValueError("the gateway needs at least one worker URL")
        # what a client may take (server/guard.py): request bytes, seconds per body and write
        self.client_timeout = positive_number(client_timeout, "client_timeout")
        self.max_request_bytes = positive_int(max_request_bytes, "max_request_bytes")
        self.urls, self.routing, self.tokens = [u.rstrip("/") for u in urls], routing, tokens
        self._tokenize_turn = itertools.count()       # whose turn it is to tokenize first
        self.health_interval, self.scrape_interval = health_interval, scrape_interval
        self.failures_to_leave = failures_to_leave
        self.timeout = timeout
        self.metrics = GatewayMetrics()
        self.session: aiohttp.ClientSession | None = None   # probes, tokenizing, discovery
        self.upstream = Upstream(timeout)                   # the generation requests
        self.tasks: list[asyncio.Task] = []
        self.relays: set[Reply] = set()               # the streams being relayed now
        self.closing: str | None = None               # why they were cut (drain)

    # ---- the fleet ----------------------------------------------------------------------------
    async def start(self) -> None:
        # nothing is compressed, so bytes pass through as they came
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4096, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=self.timeout),
            auto_decompress=False, skip_auto_headers=("Accept-Encoding",))
        workers = [Worker(u) for u in self.urls]
        for w in workers:                  # one that does not answer starts out of the rotation
            try:
                await discover(self.session, w)
            except (*WORKER_ERRORS, ValueError) as e:
                log.warning("worker %s does not answer (%s): out of the rotation until it does",
                            w.url, type(e).__name__)
                w.healthy, w.failures = False, self.failures_to_leave
        self._check_models(workers)
        self.routing.build(workers)
        self._count_healthy()
        self.tasks = [asyncio.create_task(every(self.health_interval, self._health)),
                      asyncio.create_task(every(self.scrape_interval, self._scrape))]

    async def drain(self, reason: str = "the gateway is shutting down") -> None:
        """End every stream still relayed with an error event naming `reason` (a shutdown
        that will not wait for them): their upstream responses are closed."""
        self.closing = reason
        for resp in list(self.relays):
            resp.close()

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.routing.close()
        self.upstream.close()
        if self.session is not None:
            await self.session.close()

    @staticmethod
    def _check_models(workers: list[Worker]) -> None:
        models = {w.model for w in workers if w.model is not None}     # None: not known yet
        if len(models) > 1:
            raise ValueError(f"the workers serve different models: {sorted(map(str, models))}")

    async def add(self, url: str, events: EventSource | None) -> Worker:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"a worker URL is http://HOST:PORT or https://..., got {url!r}")
        url = url.rstrip("/")
        if url in [w.url for w in self.routing.workers]:
            raise ValueError(f"worker {url} is in the fleet already")
        w = Worker(url)
        await discover(self.session, w)
        workers = self.routing.workers + [w]
        self._check_models(workers)
        if events is not None:
            self.routing.events[url] = events
        self.routing.build(workers)
        self._count_healthy()
        return w

    def remove(self, url: str) -> None:
        url = url.rstrip("/")
        keep = [w for w in self.routing.workers if w.url != url]
        if len(keep) == len(self.routing.workers):
            raise KeyError(url)
        self.routing.events.pop(url, None)
        self.routing.build(keep)
        self._count_healthy()

    def _count_healthy(self) -> None:
        ws = self.routing.workers
        self.metrics.workers.set(len(ws))
        self.metrics.healthy.set(sum(w.healthy for w in ws))

    async def _health(self) -> None:
        for i, w in enumerate(list(self.routing.workers)):
            change = await check_health(self.session, w, self.failures_to_leave)
            if change is True and w in self.routing.workers:
                self.routing.forget(self.routing.workers.index(w))
                log.warning("worker %s failed %d health checks in a row: out of the rotation, "
                            "its pages forgotten", w.url, w.failures)
            elif change is False:
                log.warning("worker %s answers its health check: back in the rotation", w.url)
                if w.model is None:                # back, never seen: what it serves
                    await discover(self.session, w)
        self._count_healthy()

    async def _scrape(self) -> None:
        for w in list(self.routing.workers):
            if w.healthy:
                await scrape(self.session, w, self.scrape_interval)

    # ---- a request ----------------------------------------------------------------------------
    async def generate(self, raw: HTTPRequest, path: str, chat: bool):
        parsed = await self._request(raw, chat)
        if isinstance(parsed, Response):
            return parsed
        content, body, info = parsed
        headers = {k: v for k, v in raw.headers.items() if k.lower() in PASSED_HEADERS}
        headers["content-type"] = "application/json"
        sent = await self._send(info, lambda w: self.upstream.post(f"{w.url}{path}", content,
                                                                   headers))
        if isinstance(sent, Response):
            return sent
        resp, w = sent
        if resp.status >= 400 or not body.get("stream"):
            return await self._whole(resp, info, w)
        self.relays.add(resp)
        return BridgedResponse(
            resp, timeout=self.client_timeout, on_first=lambda: self._first(info),
            on_end=lambda tail, failure: self._ended(resp, info, w.url, tail, failure),
            closing=lambda: self.closing)

    async def _request(self, raw: HTTPRequest, chat: bool
                       ) -> tuple[bytes, dict, RequestInfo] | Response:
        """(the body as it came, parsed, the request as the router sees it), or the error
        response for a body that is not a JSON object, a prompt that does not tokenize or is
        empty, or a token id no page hash can take."""
        try:
            content = await raw.body()     # forwarded as it came: NaN, lone surrogates and all
            body = json.loads(content)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not valid JSON: {e}", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_request_error")
        tokens = await self._tokenize(body, chat)
        if isinstance(tokens, Response):
            return tokens
        if not tokens:
            return _error(400, "the prompt is empty", "invalid_request_error")
        if min(tokens) < 0 or max(tokens) >= 2**32:                     # no hash can take it
            bad = next(t for t in tokens if not 0 <= t < 2**32)
            return _error(400, f"prompt token id {bad} is outside [0, 2**32)",
                          "invalid_request_error")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        info = RequestInfo(f"route-{next(_ids)}", tokens, (None, body.get("cache_salt")),
                           body.get("user"), time.monotonic(),
                           limit if type(limit) is int and limit > 0 else      # not a bool
                           DEFAULT_MAX_TOKENS[chat])
        return content, body, info

    async def _send(self, info: RequestInfo, send) -> tuple[aiohttp.ClientResponse, Worker] \
            | Response:
        """Route `info` and `send(worker)` it: (the worker's response, the worker), retried
        once on the next best worker when the first fails before its first byte (refused,
        reset, 5xx); an error response when no worker is left or both failed."""
        tried: set[int] = set()
        retries = 0
        while True:
            placed = await self._place(info, frozenset(tried), send)
            if placed is None:
                self.metrics.errors.labels("no_worker").inc()
                return _error(503, "no healthy worker could take the request")
            i, w, predicted, sending = placed
            self.metrics.predicted.inc(min(predicted, len(info.tokens) - 1))
            log.debug("%s: %d prompt tokens to %s (%d held there)", info.rid, len(info.tokens),
                      w.url, predicted)
            self.metrics.requests.labels(w.url).inc()
            try:
                resp = await sending
                failed = f"HTTP {resp.status}"
            except WORKER_ERRORS as e:
                resp, failed = None, type(e).__name__
            if resp is not None and resp.status < 500:
                return resp, w
            if resp is not None:
                resp.close()
            self.routing.finished(info.rid)
            tried.add(i)
            retries += 1
            if retries > 1:                      # a lone worker is tried twice too
                log.warning("%s: worker %s failed it too (%s): 502", info.rid, w.url, failed)
                self.metrics.errors.labels("upstream").inc()
                return _error(502, f"the workers failed the request (last: {w.url})")
            log.warning("%s: worker %s failed before the first byte (%s): one retry on the "
                        "next best worker", info.rid, w.url, failed)
            self.metrics.retries.inc()

    async def _place(self, info: RequestInfo, tried: frozenset[int], send):
        """(worker index, worker, tokens predicted held there, the send begun) for `info`, or
        None when no healthy worker is left; the decision's time observed."""
        t0 = time.perf_counter()
        if len(info.tokens) > INLINE_TOKENS:
            placed = await asyncio.to_thread(self.routing.place, info, tried)
            self.metrics.decision.observe(time.perf_counter() - t0)
            if placed is None:
                return None
            i, w, predicted = placed
            return i, w, predicted, send(w)
        # one hold of the lock, so no event batch or other request comes between the choice
        # and its record; on a kept-alive connection the request is written in between, and
        # the worker reads it while the gateway records it
        with self.routing.lock:
            i = self.routing.choose(info, tried)
            self.metrics.decision.observe(time.perf_counter() - t0)
            if i is None:
                return None
            w = self.routing.workers[i]
            sending = send(w)
            return i, w, self.routing.record(i, info), sending

    async def _whole(self, resp: aiohttp.ClientResponse, info: RequestInfo, w: Worker
                     ) -> Response:
        """A reply that is not streamed (or an error), read whole: the connection is kept."""
        try:
            content = await resp.read()
        except WORKER_ERRORS as e:
            log.warning("%s: worker %s failed its reply (%s): 502", info.rid, w.url,
                        type(e).__name__)
            self.metrics.errors.labels("upstream").inc()
            return _error(502, f"the worker failed its reply ({type(e).__name__})")
        finally:
            resp.close()
            self.routing.finished(info.rid)
        if resp.status == 200:
            self._reported(content)
        return Response(content, resp.status, media_type=resp.content_type)

    async def _tokenize(self, body: dict, chat: bool) -> list[int] | Response:
        """The request's token ids, from the healthy workers in turn (each request starts at
        the next one, so the load is spread), the first that answers (one that fails —
        refused, timed out, 5xx — is passed over: it may have died since its last health
        check; a single one is asked twice); a worker's 4xx, or an error response when none
        answers. A prompt of token ids, or a local tokenizer, asks no worker."""
        probes = [w for w in self.routing.workers if w.healthy]
        if not probes:
            self.metrics.errors.labels("no_worker").inc()
            return _error(503, "no healthy worker")
        k = next(self._tokenize_turn) % len(probes)
        probes = probes[k:] + probes[:k]
        if len(probes) == 1:            # a second try, as a request's retry (Routing.choose)
            probes *= 2
        for w in probes:
            try:
                return await self.tokens.of(self.session, w.url, body, chat, self._asked)
            except TokenizeError as e:
                if e.status < 500:
                    return Response(e.content, e.status, media_type=e.content_type)
                failed = f"HTTP {e.status}"
            except WORKER_ERRORS as e:
                failed = type(e).__name__
            log.warning("tokenizing on worker %s failed (%s)", w.url, failed)
        self.metrics.errors.labels("tokenize").inc()
        return _error(502, f"tokenizing failed on every healthy worker (last: {w.url}: {failed})")

    def _asked(self, worker: str) -> None:
        self.metrics.tokenized.labels(worker).inc()

    def _first(self, info: RequestInfo) -> None:
        now = time.monotonic()
        self.metrics.ttft.observe(now - info.arrival)
        self.routing.first_output(info.rid, now)

    def _ended(self, reply: Reply, info: RequestInfo, worker: str, tail: bytes | None,
               failure: str | None) -> None:
        self.relays.discard(reply)
        if failure is not None and self.closing is None:
            log.warning("%s: worker %s failed mid-stream (%s): ended with an error event",
                        info.rid, worker, failure)
            self.metrics.errors.labels("midstream").inc()
        if tail is not None:
            self._reported(tail)
        self.routing.finished(info.rid)

    def _reported(self, content: bytes) -> None:
        """Count the cached tokens a worker reported in `usage` (the last usage in `content`)."""
        text = content.decode("utf-8", errors="replace")
        at = text.rfind('"cached_tokens":')
        if at >= 0:
            digits = "".join(itertools.takewhile(str.isdigit, text[at + 16:].lstrip()))
            if digits:
                self.metrics.reported.inc(int(digits))


def build_gateway_app(gw: Gateway) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="radixkv route", lifespan=lifespan)
    app.state.gateway = gw
    app.add_middleware(RequestGuard, max_bytes=gw.max_request_bytes, timeout=gw.client_timeout)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, e: StarletteHTTPException):      # no such route, a wrong method
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(e.status_code, str(e.detail), kind)

    @app.post("/v1/completions")
    async def completions(raw: HTTPRequest):
        return await gw.generate(raw, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat(raw: HTTPRequest):
        return await gw.generate(raw, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models():
        ws = gw.routing.workers
        names = sorted({w.model for w in ws if w.model})
        return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "radixkv"}
                                           for m in names]}

    @app.get("/health")
    async def health():
        if any(w.healthy for w in gw.routing.workers):
            return Response(status_code=200)
        return _error(503, "no healthy worker")

    @app.get("/metrics")
    async def metrics():
        return Response(gw.metrics.render(gw.routing.fit_quality(), gw.routing.feed_counts(),
                                           gw.routing.hash_counts()),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/workers")
    async def workers():
        out = {"router": gw.routing.router_name,
               "workers": [w.describe() for w in gw.routing.workers]}
        q = gw.routing.fit_quality()
        if q is not None:
            out["ttft_fit"] = q._asdict()
        return out

    @app.post("/workers")
    async def add_worker(raw: HTTPRequest):
        try:
            body = await raw.json()
            url = body["url"]
            events = parse_events_value(body["kv_events"]) if body.get("kv_events") else None
            w = await gw.add(url, events)
        except WORKER_ERRORS as e:                     # the URL given names no worker
            return _error(400, f"cannot add the worker: {url!r} does not answer as one "
                               f"({type(e).__name__})", "invalid_request_error")
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, f"cannot add the worker: {e}", "invalid_request_error")
        return w.describe()

    @app.delete("/workers/{url:path}")
    async def remove_worker(url: str):
        try:
            gw.remove(url)
        except KeyError:
            return _error(404, f"no worker {url} in the fleet", "not_found_error")
        except ValueError as e:
            return _error(400, str(e), "invalid_request_error")
        return {"removed": url.rstrip("/")}

    return app


def parse_events_value(text: str, bind: bool = False) -> EventSource:
    """`tcp://H:P` or `tcp://H:P,tcp://H:P` (the PUB socket, then the replay socket); `bind`:
    the publisher connects to the PUB address, so the gateway binds it."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not 1 <= len(parts) <= 2 or not all(p.startswith(("tcp://", "ipc://")) for p in parts):
        raise ValueError(f"KV events {text!r}: expected tcp://HOST:PORT[,tcp://HOST:PORT]")
    return EventSource(parts[0], parts[1] if len(parts) == 2 else None, bind)
