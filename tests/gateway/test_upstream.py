"""The gateway's client to its workers (gateway/upstream.py) against scripted loopback servers:
kept-alive connections, a connection closed while idle, streamed pieces in order, pausing,
failures mid-body, a silent worker, a reply that is not HTTP, and a waiter that gives up."""
from __future__ import annotations

import asyncio

import pytest

from radixkv.gateway.upstream import Upstream, WorkerClosed


def reply(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


def chunked(*pieces: bytes, end: bool = True) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + ([b"0\r\n\r\n"] if end else [])


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's body (None at EOF)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                  if ln.lower().startswith(b"content-length:"))
    return await reader.readexactly(length)


class Server:
    """A loopback server running `script(reader, writer, n)` for its n-th connection."""

    def __init__(self, script):
        self.script, self.connections, self.bodies = script, 0, []

    async def __aenter__(self):
        async def handle(reader, writer):
            self.connections += 1
            try:
                await self.script(self, reader, writer, self.connections)
            finally:
                writer.close()
        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/completions"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def echo_keep_alive(srv, reader, writer, n):
    while (body := await read_request(reader)) is not None:
        srv.bodies.append(body)
        writer.write(reply(b"got " + body))
        await writer.drain()


def test_kept_alive_connection_serves_the_next_request_and_bodies_are_exact():
    async def main():
        async with Server(echo_keep_alive) as srv:
            up = Upstream(5.0)
            out = []
            for body in (b"one", b"two" * 1000, b""):
                r = await up.post(srv.url, body, {"content-type": "application/json"})
                out.append((r.status, r.content_type, await r.read()))
            up.close()
            return out, srv.connections, srv.bodies
    out, connections, bodies = run(main())
    assert out == [(200, "text/plain", b"got one"), (200, "text/plain", b"got " + b"two" * 1000),
                   (200, "text/plain", b"got ")]
    assert connections == 1 and bodies == [b"one", b"two" * 1000, b""]


def test_on_a_kept_alive_connection_the_request_is_written_before_the_caller_awaits():
    # the gateway records a routed request between post and await: the worker reads it meanwhile
    async def main():
        async with Server(echo_keep_alive) as srv:
            up = Upstream(5.0)
            await (await up.post(srv.url, b"first", {})).read()   # a connection to keep alive
            sending = up.post(srv.url, b"second", {})
            for _ in range(200):                      # the loop runs; `sending` is not awaited
                if len(srv.bodies) == 2:
                    break
                await asyncio.sleep(0.01)
            got_before = list(srv.bodies)
            reply_ = await sending
            body = await reply_.read()
            up.close()
            return got_before, body, srv.connections
    assert run(main()) == ([b"first", b"second"], b"got second", 1)


def test_a_connection_the_worker_closed_while_idle_is_replaced_once_transparently():
    async def script(srv, reader, writer, n):
        body = await read_request(reader)
        srv.bodies.append(body)
        writer.write(reply(b"ok %d" % n))            # kept alive, then closed while idle
        await writer.drain()

    async def main():
        async with Server(script) as srv:
            up = Upstream(5.0)
            first = await (await up.post(srv.url, b"a", {})).read()
            await asyncio.sleep(0.2)                  # the server closed it meanwhile
            second = await (await up.post(srv.url, b"b", {})).read()
            up.close()
            return first, second, srv.connections, srv.bodies
    assert run(main()) == (b"ok 1", b"ok 2", 2, [b"a", b"b"])


def test_streamed_pieces_reach_the_sink_in_order_and_pausing_stops_reading():
    pieces = [b"data: %d\n\n" % i for i in range(6)]

    async def script(srv, reader, writer, n):
        await read_request(reader)
        for part in chunked(*pieces):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.02)

    async def main():
        async with Server(script) as srv:
            up = Upstream(5.0)
            r = await up.post(srv.url, b"{}", {})
            got, ends, done = [], [], asyncio.Event()
            paused_at = []

            def sink(data):
                got.append(data)
                if len(got) == 2:
                    r.pause()
                    paused_at.append(len(got))
                    asyncio.get_running_loop().call_later(0.3, r.resume)

            r.stream(sink, lambda e: (ends.append(e), done.set()))
            await asyncio.sleep(0.2)
            during_pause = len(got)
            await done.wait()
            up.close()
            return got, ends, during_pause, r.done
    got, ends, during_pause, done = run(main())
    assert b"".join(got) == b"".join(pieces) and ends == [None] and done
    assert during_pause == 2                         # nothing read while paused


def test_a_worker_that_fails_mid_body_ends_the_stream_with_its_error():
    async def script(srv, reader, writer, n):
        await read_request(reader)
        for part in chunked(b"data: a\n\n", end=False):
            writer.write(part)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    async def main():
        async with Server(script) as srv:
            up = Upstream(5.0)
            r = await up.post(srv.url, b"{}", {})
            got, ended = [], asyncio.get_running_loop().create_future()
            r.stream(got.append, ended.set_result)
            err = await ended
            r2 = await up.post(srv.url, b"{}", {})    # a fresh connection; read whole: fails
            with pytest.raises(WorkerClosed):
                await r2.read()
            return got, err, up._idle
    got, err, idle = run(main())
    assert got == [b"data: a\n\n"] and isinstance(err, WorkerClosed)
    assert all(not pool for pool in idle.values())    # neither connection went back


def test_a_silent_worker_times_out_and_a_reply_that_is_not_http_fails():
    async def silent(srv, reader, writer, n):
        await read_request(reader)
        await asyncio.sleep(5)

    async def garbage(srv, reader, writer, n):
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def main():
        out = []
        async with Server(silent) as srv:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(TimeoutError):
                await Upstream(0.3).post(srv.url, b"{}", {})
            out.append(asyncio.get_running_loop().time() - t0)
        async with Server(garbage) as srv:
            with pytest.raises(WorkerClosed, match="not HTTP"):
                await Upstream(5.0).post(srv.url, b"{}", {})
        with pytest.raises(WorkerClosed, match="not an http"):
            await Upstream(5.0).post("ftp://127.0.0.1:1/x", b"", {})
        with pytest.raises(ConnectionRefusedError):
            await Upstream(5.0).post(srv.url, b"{}", {})       # closed: refused
        return out
    (took,) = run(main())
    assert 0.3 <= took < 3


def test_a_body_ended_by_the_connection_closing_is_complete_and_not_kept():
    async def script(srv, reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async def main():
        async with Server(script) as srv:
            up = Upstream(5.0)
            body = await (await up.post(srv.url, b"{}", {})).read()
            return body, up._idle
    body, idle = run(main())
    assert body == b"all of it" and all(not pool for pool in idle.values())


def test_a_waiter_that_gives_up_drops_the_connection():
    async def script(srv, reader, writer, n):
        await read_request(reader)
        srv.closed = asyncio.get_running_loop().create_future()
        await reader.read()                           # EOF: the gateway dropped it
        srv.closed.set_result(True)

    async def main():
        async with Server(script) as srv:
            up = Upstream(5.0)
            task = asyncio.ensure_future(up.post(srv.url, b"{}", {}))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await asyncio.wait_for(srv.closed, 5), up._idle
    closed, idle = run(main())
    assert closed and all(not pool for pool in idle.values())
