"""The generation requests' way to a worker: an HTTP/1.1 client of asyncio protocols, httptools'
parser and a pool of kept-alive connections per worker.

`Upstream.post` sends a request (written at once on a kept-alive connection) and gives an
awaitable of its `Reply` once the status and headers came (or a worker error: refused, reset,
timed out, not HTTP). Its body is then either read
whole (`read`) or handed, piece by piece as the socket delivers it, to a callback
(`stream`): the callback runs in the protocol's own `data_received`, so a streamed event costs
no task wake-up, reader or queue on its way through (gateway/bridge.py writes it to the
client there and then). `pause`/`resume` stop and restart reading the worker (a client that
reads slowly); `close` drops the connection, which a worker takes as the client gone.

A connection serves one request at a time and goes back to its pool when a reply ends framed
(by its length or its last chunk) and kept alive. A pooled connection the worker closed while
idle fails before a byte of reply: the request is then sent again once on a fresh connection.
A silent worker fails a request after `read_timeout` seconds without a byte.
"""
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT = 5.0


class WorkerClosed(ConnectionError):
    """The worker closed the connection, or answered what is not HTTP, before the reply ended."""


class Reply:
    """One request's reply: `status` and `headers` (lower-case names) once `Upstream.post`
    returns; the body through `read` or `stream`."""

    def __init__(self, conn: _Conn):
        self._conn = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self.done = False                   # the body ended, framed
        self.error: BaseException | None = None
        self._parts: list[bytes] = []       # body that came before a reader was given
        self._sink: Callable[[bytes], None] | None = None
        self._on_end: Callable[[BaseException | None], None] | None = None
        self._ended: asyncio.Future | None = None

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")

    async def read(self) -> bytes:
        """The whole body (the connection is then kept, or closed on a failure)."""
        if not self.done and self.error is None:
            self._ended = self._conn.loop.create_future()
            await self._ended
        if self.error is not None:
            raise self.error
        return b"".join(self._parts)

    def stream(self, sink: Callable[[bytes], None],
               on_end: Callable[[BaseException | None], None]) -> None:
        """Hand each piece of body to `sink` as it arrives (what came already, now), then call
        `on_end(None)` when the body ended framed or `on_end(error)` when it failed."""
        self._sink, self._on_end = sink, on_end
        parts, self._parts = self._parts, []
        for p in parts:
            sink(p)
        if self.done or self.error is not None:
            on_end(self.error)

    def pause(self) -> None:
        self._conn.pause()

    def resume(self) -> None:
        self._conn.resume()

    def close(self) -> None:
        """Drop the connection unless the body ended (a worker aborts the request)."""
        if not self.done:
            self._conn.abort()

    # ---- from the protocol ------------------------------------------------------------------
    def _body(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
        else:
            self._parts.append(data)

    def _end(self, error: BaseException | None) -> None:
        if self.done or self.error is not None:
            return
        if error is None:
            self.done = True
        else:
            self.error = error
        if self._on_end is not None:
            self._on_end(error)
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)


class _Conn(asyncio.Protocol):
    def __init__(self, pool: list[_Conn], read_timeout: float):
        self.pool, self.read_timeout = pool, read_timeout
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reply: Reply | None = None
        self.head: asyncio.Future | None = None
        self.seen = 0.0                  # when a byte last came
        self.received = False            # a byte of this request's reply came
        self.timer: asyncio.TimerHandle | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.framed = False
        self.lost = False

    # ---- a request --------------------------------------------------------------------------
    def send(self, request: bytes) -> asyncio.Future:
        self.reply, self.received, self.framed = Reply(self), False, False
        self.head = self.loop.create_future()
        self.seen = self.loop.time()
        if self.timer is None:
            self.timer = self.loop.call_at(self.seen + self.read_timeout, self._check)
        self.transport.write(request)
        return self.head

    def _check(self) -> None:
        # one timer a request, re-armed from the last byte's time (not one per byte)
        self.timer = None
        if self.reply is None:
            return
        due = self.seen + self.read_timeout
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._check)
        else:
            self._fail(TimeoutError(f"no byte from the worker in {self.read_timeout:g}s"))
            self.abort()

    def pause(self) -> None:
        if not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if not self.lost:
            self.transport.resume_reading()
            self.seen = self.loop.time()

    def abort(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def _fail(self, error: BaseException) -> None:
        reply, self.reply = self.reply, None
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        if reply is not None:
            reply._end(error)

    # ---- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.seen, self.received = self.loop.time(), True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(WorkerClosed(f"the worker's reply is not HTTP: {e}"))
            self.abort()

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self in self.pool:
            self.pool.remove(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.reply is not None and self.head.done() and not self.framed and exc is None:
            self.on_message_complete()            # a body delimited by the connection's end
            return
        self._fail(WorkerClosed("the worker closed the connection") if exc is None else
                   WorkerClosed(f"the connection to the worker failed: {exc}"))

    # ---- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.reply is not None:
            self.reply.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        reply = self.reply
        if reply is None:
            return
        reply.status = self.parser.get_status_code()
        self.framed = "content-length" in reply.headers or \
            "chunked" in reply.headers.get("transfer-encoding", "").lower()
        if not self.head.done():
            self.head.set_result(reply)

    def on_body(self, body: bytes) -> None:
        if self.reply is not None:
            self.reply._body(body)

    def on_message_complete(self) -> None:
        reply, self.reply = self.reply, None
        if reply is None:
            return
        keep = self.framed and not self.lost and self.parser.should_keep_alive()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if keep:
            self.pool.append(self)
        reply._end(None)
        if not keep:
            self.abort()


class Upstream:
    def __init__(self, read_timeout: float):
        self.read_timeout = read_timeout
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> Coroutine[Any, Any, Reply]:
        """POST `body` to `url` (http:// or https://); await the result for the reply once its
        headers came. On a kept-alive connection the request is written before this returns,
        so the caller's work until it awaits overlaps the worker's reading it."""
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            return _raise(WorkerClosed(f"not an http(s) URL: {url!r}"))
        port = u.port or (443 if u.scheme == "https" else 80)
        key = (u.scheme, u.hostname, port)
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        head = [f"POST {target} HTTP/1.1\r\nhost: {u.netloc}\r\ncontent-length: {len(body)}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        request = "".join(head).encode("latin-1") + b"\r\n" + body
        pool = self._idle.setdefault(key, [])
        while pool:                                   # a kept-alive connection, newest first
            conn = pool.pop()
            if not (conn.lost or conn.transport.is_closing()):
                return self._reply(conn, conn.send(request), (key, pool, request))
        return self._fresh(key, pool, request)

    async def _fresh(self, key: tuple[str, str, int], pool: list[_Conn], request: bytes) -> Reply:
        conn = await self._connect(key, pool)
        return await self._reply(conn, conn.send(request))

    async def _reply(self, conn: _Conn, head: asyncio.Future, again: tuple | None = None
                     ) -> Reply:
        """The reply `head` resolves to; `again`: (key, pool, request) to send once more on a
        fresh connection when this pooled one turns out closed while idle."""
        try:
            return await head
        except WorkerClosed:
            if again is None or conn.received:
                raise
        except asyncio.CancelledError:                # nobody waits for it: the worker aborts
            conn.abort()
            raise
        return await self._fresh(*again)

    async def _connect(self, key: tuple[str, str, int], pool: list[_Conn]) -> _Conn:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = ssl.create_default_context() if scheme == "https" else None
        async with asyncio.timeout(CONNECT_TIMEOUT):
            _, conn = await loop.create_connection(
                lambda: _Conn(pool, self.read_timeout), host, port, ssl=tls)
        return conn

    def close(self) -> None:
        for pool in self._idle.values():
            for conn in list(pool):
                conn.abort()
            pool.clear()


async def _raise(error: BaseException) -> Reply:
    raise error
