"""A worker's event stream, written to the client's socket from the callback that reads it.

`BridgedResponse` is the gateway's streamed reply. After the response head (sent through ASGI
as usual), each piece of the worker's body is framed as an HTTP chunk and written to the
client's transport inside the upstream protocol's `data_received` (gateway/upstream.py): no
task wake-up, ASGI message or middleware call per event. That is half the CPU per relayed
event of a relay through aiohttp's reader and ASGI sends (benchmarks/RESULTS.md). The last
chunk goes through ASGI again, so uvicorn ends the response and keeps the connection.

The request's coroutine meanwhile waits for one of three things: the stream's end, the
client's hang-up (the worker's connection is then dropped, which aborts the request there), or
a full client socket. When uvicorn's flow control pauses writing, the worker is no longer read
until the client takes its bytes; a client that takes none for `client_timeout` seconds is
dropped as server/guard.py drops one (ClientStalled). A worker that fails mid-stream, or a
gateway draining, ends the stream with an error event.

The client's connection is uvicorn's httptools protocol (server/connection.py puts it in the
scope as CONNECTION_KEY), whose chunked framing this writes exactly as uvicorn does.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from radixkv.gateway.upstream import Reply
from radixkv.server.guard import CONNECTION_KEY, ClientStalled

TAIL = 4096                 # bytes of the stream's end kept: its usage is read from them


class BridgedResponse(Response):
    def __init__(self, reply: Reply, *, timeout: float, on_first: Callable[[], None],
                 on_end: Callable[[bytes, str | None], None],
                 closing: Callable[[], str | None]):
        """`on_first()` when the stream's head holds content (`has_content`); `on_end(tail,
        failure)` once, however it ends (tail: the stream's last bytes if it was relayed to its
        end, else None; failure: the worker's error's name, or None); `closing()`: why the
        gateway cut its streams, if it did."""
        # no body, so no content-length: uvicorn frames the response in chunks
        self.status_code, self.background = reply.status, None
        self.media_type = reply.content_type or "text/event-stream"
        self.init_headers(None)
        self.reply, self.timeout = reply, timeout
        self.on_first, self.on_end, self.closing = on_first, on_end, closing
        self.head = b""
        self.tail = b""
        self.begun = False
        self.wake: asyncio.Future | None = None
        self.ended: BaseException | None | bool = False      # False: not yet

    async def __call__(self, scope, receive, send) -> None:
        conn = scope.get("extensions", {}).get(CONNECTION_KEY)
        if not isinstance(conn, HttpToolsProtocol):
            self.reply.close()
            self._finish(RuntimeError("not an httptools connection"))
            raise RuntimeError("radixkv route streams need uvicorn's httptools protocol")
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        self.transport, self.flow = conn.transport, conn.flow
        loop = asyncio.get_running_loop()
        gone = asyncio.ensure_future(receive())        # http.disconnect, when the client leaves
        try:
            self.wake = loop.create_future()
            self.reply.stream(self._data, self._end)
            while True:
                await asyncio.wait((self.wake, gone), return_when=asyncio.FIRST_COMPLETED)
                if gone.done() or self.transport.is_closing():
                    # hung up: uvicorn is told on the loop's next turns (it then expects no
                    # more of the response); the worker's side is dropped below
                    await asyncio.wait((gone,), timeout=1.0)
                    return
                if self.ended is not False:
                    break
                self.wake = loop.create_future()       # paused: the client's socket is full
                try:
                    async with asyncio.timeout(self.timeout):
                        await self.flow.drain()
                except TimeoutError:
                    raise ClientStalled() from None
                self.reply.resume()
            if self.ended is not None:                 # the worker failed after the first byte
                self._write(self._error_event())
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            self.reply.close()
            self._finish(None if self.ended is False else self.ended)

    # ---- from the worker's protocol: the hot path ---------------------------------------------
    def _data(self, data: bytes) -> None:
        if self.transport.is_closing():                # the client left: read no more
            self.reply.pause()
            self._signal()
            return
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        if not self.begun:                             # until the first content (a role chunk
            self.head += data                          # of a chat is not)
            if has_content(self.head):
                self.begun = True
                self.on_first()
        self.tail = data[-TAIL:] if len(data) >= TAIL else (self.tail + data)[-TAIL:]
        if self.flow.write_paused:
            self.reply.pause()
            self._signal()

    def _end(self, error: BaseException | None) -> None:
        self.ended = error
        self._signal()

    def _signal(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    # ---- the end ------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def _error_event(self) -> bytes:
        reason = self.closing()
        if reason is not None:
            err = {"object": "error", "error": {"message": reason, "param": None,
                                                "type": "server_error", "code": 503}}
        else:
            err = {"error": {"message": f"the worker failed mid-stream: "
                                        f"{type(self.ended).__name__}",
                             "type": "server_error", "code": 502}}
        return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()

    def _finish(self, error: BaseException | None) -> None:
        on_end, self.on_end = self.on_end, None
        if on_end is not None:               # the tail only of a stream relayed to its end
            on_end(self.tail if self.ended is None else None,
                   None if error is None else type(error).__name__)


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
