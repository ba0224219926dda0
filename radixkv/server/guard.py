"""The ASGI middleware between uvicorn and the routes that keeps a hostile client's cost bounded.

- Body size: a body over `max_bytes` is answered 413 (OpenAI error body, `connection: close`)
  before anything parses it — at once from its Content-Length, else (chunked) as soon as the
  bytes counted pass the limit.
- Body time: the whole body must arrive within `timeout` seconds of the headers, else 408.
- Reading time: each message of the response must reach the socket within `timeout` seconds; a
  client that reads too slowly (or not at all) is dropped: the response ends, the app's stream
  is closed (its `finally` aborts the request on the engine), the connection is aborted (the
  handle server/connection.py puts in the scope; a plain close would wait for the unread bytes
  to drain), and one warning names the request and the timeout.

The body is read here (bounded) and replayed to the app as one message.
"""
from __future__ import annotations

import asyncio
import json
import logging

from radixkv.server import protocol as P

log = logging.getLogger(__name__)
ABORT_KEY = "radixkv.abort"     # scope["extensions"][ABORT_KEY]: the connection's abort()
CONNECTION_KEY = "radixkv.connection"   # ...[CONNECTION_KEY]: its uvicorn protocol (a bridge's)
RID_KEY = "rid"                 # scope["state"][RID_KEY]: the engine request's id, once known
DEFAULT_CLIENT_TIMEOUT = 30.0   # s: request headers, body, each response write
DEFAULT_MAX_REQUEST_BYTES = 64 << 20


class ClientStalled(Exception):
    """A response message could not be handed to the socket within the timeout."""


class RequestGuard:
    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:                       # answered (413 / 408) or the client left
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()             # after the body: the disconnect, when it comes

        deadline = _SendDeadline(self.timeout)

        async def timed_send(message) -> None:
            deadline.begin()
            try:
                await send(message)
            except asyncio.CancelledError:
                if deadline.fired:                     # the deadline's cancellation, used once
                    deadline.fired = False
                    if deadline.task.uncancel() == 0:  # ...and no other one pending
                        raise ClientStalled() from None
                raise
            finally:
                deadline.since = None

        try:
            await self.app(scope, replay, timed_send)
        except BaseException as e:
            if not _stalled(e):
                raise
            await self._drop(scope)
        finally:
            deadline.close()

    async def _read_body(self, scope, receive, send) -> bytes | None:
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _answer(scope, send, 413, f"the request body is {declared} bytes; the limit "
                                            f"is {self.max_bytes} (--max-request-bytes)")
            return None
        parts, size = [], 0
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:
                        await _answer(scope, send, 413, f"the request body is over the limit "
                                                        f"of {self.max_bytes} bytes "
                                                        f"(--max-request-bytes)")
                        return None
                    parts.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(parts)
        except TimeoutError:
            log.warning("%s: the request body did not arrive within %gs (--client-timeout); "
                        "answered 408", _name(scope), self.timeout)
            await _answer(scope, send, 408, f"the request body did not arrive within "
                                            f"{self.timeout:g}s (--client-timeout)", "timeout")
            return None

    async def _drop(self, scope) -> None:
        log.warning("%s: the client did not read the response for %gs (--client-timeout); "
                    "connection closed", _name(scope), self.timeout)
        abort = scope.get("extensions", {}).get(ABORT_KEY)
        if abort is not None:
            abort()
            # the transport reports the loss on the next turns of the loop; uvicorn then sees
            # a disconnected client rather than a response the app left incomplete
            for _ in range(2):
                await asyncio.sleep(0)


class _SendDeadline:
    """Each response message of one request must reach the socket within `timeout` seconds. One
    timer serves the whole request: armed when a send begins with none armed, it re-arms at the
    pending send's own deadline when it finds that not yet due, and cancels the sending task when
    it is. A stream of quick sends costs a clock read each, not a timer each (an asyncio.timeout
    per send cost as much as the socket write itself)."""

    def __init__(self, timeout: float):
        self.timeout, self.loop = timeout, asyncio.get_running_loop()
        self.since: float | None = None      # when the pending send began; None: none pending
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.fired = False

    def begin(self) -> None:
        # the loop given: without it, each call asks for the running loop, a getpid() each
        self.since, self.task = self.loop.time(), asyncio.current_task(self.loop)
        if self.timer is None:
            self.timer = self.loop.call_at(self.since + self.timeout, self._check)

    def _check(self) -> None:
        self.timer = None
        if self.since is None:
            return
        due = self.since + self.timeout
        if self.loop.time() >= due:
            self.fired = True
            self.task.cancel()
        else:
            self.timer = self.loop.call_at(due, self._check)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _stalled(e: BaseException) -> bool:
    if isinstance(e, ClientStalled):
        return True
    if isinstance(e, BaseExceptionGroup):
        return all(_stalled(x) for x in e.exceptions)
    return False


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None                # the HTTP parser has refused it already
    return None


def _name(scope) -> str:
    rid = scope.get("state", {}).get(RID_KEY)
    client = scope.get("client")
    where = f" from {client[0]}:{client[1]}" if client else ""
    return f"request {rid or '-'} ({scope['method']} {scope['path']}{where})"


async def _answer(scope, send, status: int, message: str,
                  kind: str = "invalid_request_error") -> None:
    """An OpenAI error body, and the connection closed after it (the rest of an unread body
    is not worth reading)."""
    body = json.dumps(P.error_body(message, kind, None, status)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
