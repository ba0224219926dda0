"""Clients that misbehave on purpose, one connection each: one that stops reading a stream, one
that trickles its headers or body, one that sends too much (tests/server/test_heavy_requests.py
has the 10 MB prompt and the thousand clients). Each test states what the client sees, that the
server frees everything (`check_clean`), what it logs, and, where it matters, that the other
clients keep their pace.

The servers are the simulated llama-3-8b on an H200 (about 150 tokens/s for one stream, fast
enough to fill socket buffers in seconds), on 127.0.0.1, with a short --client-timeout (2 s;
the default is 30 s)."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from radixkv.config import EngineConfig
from radixkv.server import app as app_module, updates
from radixkv.server.build import ServeOptions, build_server
from tests.server._helpers import check_clean, metric, wait_idle
from tests.server._hostile import (FILLER, ITL_RATIO, ITL_SLACK, MODEL, TIMEOUT, aborted, p99,
                                  post_bytes, raw_socket, read_to_eof, server, sse_texts,
                                  stream_itls, wait_until)


@pytest.fixture()
def queues(monkeypatch):
    """Every UpdateQueue the completion routes make, in order."""
    made: list[updates.UpdateQueue] = []

    class Recorded(updates.UpdateQueue):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)
    monkeypatch.setattr(app_module, "UpdateQueue", Recorded)
    return made


# ---- 1. a reader that stops reading mid-stream ------------------------------------------------

def test_a_reader_that_stops_reading_is_dropped_and_the_others_keep_their_pace(queues):
    """The client sees its stream cut: a prefix of the output (no finish, no [DONE]), then the
    connection closed by the server once a write has waited --client-timeout. The server aborts
    the request (slots freed), its queued updates stayed within MAX_PENDING_UPDATES, it logs
    one warning naming the request and the timeout (no uvicorn error), and four other streams
    kept their p99 inter-token latency within 2x (+10 ms) of a run without the stalled reader."""
    n, tokens = 4, 450
    with server(sndbuf=16_384) as (url, state, _, logs):
        base = stream_itls(url, n, tokens)
        assert len(queues) == n and aborted(url) == 0
        s = raw_socket(url, rcvbuf=4096)
        port = s.getsockname()[1]
        try:
            s.sendall(post_bytes({"prompt": "hello", "max_tokens": 8000, "ignore_eos": True,
                                   "stream": True}))
            wait_until(lambda: len(queues) == n + 1, "the stalled request")
            stalled = queues[-1]
            # the server's writes to it are paused: its updates start to pile up
            wait_until(lambda: stalled.qsize() > 20, "the stalled stream's writes to pause")
            with_stall = stream_itls(url, n, tokens)      # ~3 s: across the drop, 2 s later
            wait_until(lambda: aborted(url) == 1, "the stalled request's abort")
            got = read_to_eof(s)                    # what the kernels held, then the close
        finally:
            s.close()
        wait_idle(state)
        check_clean(state)
        rid = stalled.req.rid
        assert got.startswith(b"HTTP/1.1 200 OK")
        texts, reasons = sse_texts(got)
        assert len(texts) > 100 and FILLER.startswith("".join(texts))
        assert set(reasons) == {None} and b"[DONE]" not in got
        assert stalled.peak <= updates.MAX_PENDING_UPDATES and not stalled.overflowed
        assert len(stalled.req.output) < 8000
        assert logs.at_least(logging.WARNING) == [
            f"radixkv.server.guard: request {rid} (POST /v1/completions from 127.0.0.1:{port}): "
            f"the client did not read the response for 2s (--client-timeout); connection closed"]
        assert aborted(url) == 1
        p_base, p_stall = p99(base), p99(with_stall)
        print(f"\nITL p99: {p_base * 1e3:.1f} ms alone, {p_stall * 1e3:.1f} ms beside the "
              f"stalled reader; {len(got)} bytes reached it, queue peak {stalled.peak}")
        assert p_stall <= ITL_RATIO * p_base + ITL_SLACK


def test_updates_past_the_bound_abort_the_request_before_the_timeout(queues, monkeypatch):
    """With room for 64 unread updates (and a timeout long enough not to act), the stalled
    request is aborted as its 63rd update waits: the engine frees it at once, the queue never
    holds more than 64, one warning names it. A reader that comes back then gets what was
    queued — a prefix of the output — and the end: finish_reason "abort", [DONE]."""
    monkeypatch.setattr(updates, "MAX_PENDING_UPDATES", 64)
    with server(sndbuf=16_384, client_timeout=20.0) as (url, state, _, logs):
        s = raw_socket(url, rcvbuf=4096)
        try:
            s.sendall(post_bytes({"prompt": "hello", "max_tokens": 8000, "ignore_eos": True,
                                   "stream": True}))
            wait_until(lambda: len(queues) == 1 and queues[0].overflowed, "the overflow")
            q = queues[0]
            wait_until(lambda: aborted(url) == 1, "the abort")
            wait_idle(state)
            check_clean(state)
            assert q.peak <= 64 and len(q.req.output) < 8000
            got = bytearray()
            while not got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):   # the last chunk
                chunk = s.recv(1 << 16)
                assert chunk, "the server closed the stream before its end"
                got += chunk
        finally:
            s.close()
        texts, reasons = sse_texts(bytes(got))
        assert reasons[-1] == "abort" and set(reasons[:-1]) == {None}
        assert FILLER.startswith("".join(texts)) and len("".join(texts)) <= len(q.req.output)
        assert logs.at_least(logging.WARNING) == [
            f"radixkv.server.updates: request {q.req.rid}: its client left 63 updates unread; "
            f"aborted"]


# ---- 2. slow headers, slow body (slowloris) -----------------------------------------------------

def _trickle(s: socket.socket, data: bytes, every: float, limit: float) -> bytes:
    """Send `data` a byte at a time, `every` seconds apart, until the server answers and closes
    (its answer is returned) or `limit` seconds pass (fails)."""
    t0, got = time.monotonic(), bytearray()
    s.setblocking(False)
    for b in data:
        try:
            s.send(bytes([b]))
        except OSError:                          # the server closed: read what it said
            break
        deadline = time.monotonic() + every
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(4096)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if not chunk:
                return bytes(got)
            got += chunk
        assert time.monotonic() - t0 < limit, "the server kept a trickling client"
    s.setblocking(True)
    return bytes(got) + read_to_eof(s, limit)


def _json_body(raw: bytes) -> dict:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def test_slow_headers_and_slow_bodies_are_dropped_while_others_are_served():
    """A client trickling its headers, one that connects and sends nothing, and one trickling
    its body each get a 408 with an OpenAI error body and a closed connection once
    --client-timeout (2 s) has passed, and not before; meanwhile a normal client is served
    (200s). Nothing reached the engine; three warnings, one per dropped client."""
    with server() as (url, state, _, logs):
        results: dict[str, tuple[bytes, float]] = {}
        body = json.dumps({"prompt": "hi", "max_tokens": 4}).encode()
        head = (b"POST /v1/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json"
                b"\r\ncontent-length: %d\r\n\r\n" % len(body))

        def slow(name: str, first: bytes, rest: bytes):
            t0 = time.monotonic()                # the headers' deadline runs from the connect
            s = raw_socket(url)
            try:
                s.sendall(first)
                results[name] = (_trickle(s, rest, 0.25, 15.0), time.monotonic() - t0)
            finally:
                s.close()
        jobs = [threading.Thread(target=slow, args=a) for a in
                (("headers", b"", head), ("silent", b"", b""), ("body", head, body))]
        for j in jobs:
            j.start()
        served = 0
        while any(j.is_alive() for j in jobs):
            r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4},
                           timeout=10)
            assert r.status_code == 200, r.text
            served += 1
        for j in jobs:
            j.join()
        assert served >= 3 and set(results) == {"headers", "silent", "body"}
        for name, (got, took) in results.items():
            assert got.startswith(b"HTTP/1.1 408 "), (name, got)
            assert b"connection: close" in got.lower()
            err = _json_body(got)["error"]
            assert err["code"] == 408 and err["type"] == "timeout", err
            assert ("headers" if name != "body" else "body") in err["message"]
            assert TIMEOUT <= took < TIMEOUT + 5, (name, took)
        wait_idle(state)
        check_clean(state)
        assert aborted(url) == 0
        warned = logs.at_least(logging.WARNING)
        assert len(warned) == 3, warned
        assert sum("request headers did not arrive within 2s" in w for w in warned) == 2
        assert sum("request body did not arrive within 2s" in w for w in warned) == 1


# ---- 3. a body over the limit -------------------------------------------------------------------

def _padded(limit: int, extra: int) -> bytes:
    """A valid completion body of exactly limit + extra bytes."""
    base = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    return base[:-1] + b" " * (limit + extra - len(base)) + b"}"


def _chunked(data: bytes, size: int = 1000):
    for at in range(0, len(data), size):
        yield data[at:at + size]


def test_a_body_over_the_limit_is_refused_before_parsing_on_every_post_route():
    """--max-request-bytes 4096: a body of 4096 bytes passes (200), with Content-Length or
    chunked; one of 4097 gets a 413 with an OpenAI error body and `connection: close`, from its
    Content-Length or by counting the chunks — on every POST route, and before parsing (an
    over-limit body that is not even JSON gets the 413, not a 400)."""
    limit = 4096
    with server(max_request_bytes=limit) as (url, state, app, logs):
        ok, over = _padded(limit, 0), _padded(limit, 1)
        assert len(ok) == limit and len(over) == limit + 1
        hdr = {"content-type": "application/json"}
        with httpx.Client(base_url=url, timeout=30, headers=hdr) as c:
            for data in (ok, _chunked(ok)):
                r = c.post("/v1/completions", content=data)
                assert r.status_code == 200, r.text
            posts = sorted({r.path for r in app.routes if "POST" in getattr(r, "methods", ())})
            assert "/v1/completions" in posts and "/generate" in posts
            for path in posts:
                for data, how in ((over, "length"), (_chunked(over), "chunked"),
                                  (b"x" * (limit + 1), "length")):
                    r = c.post(path, content=data)
                    assert r.status_code == 413, (path, how, r.text)
                    assert r.headers["connection"] == "close"
                    err = r.json()["error"]
                    assert err["code"] == 413 and err["type"] == "invalid_request_error"
                    assert err["message"] == (
                        f"the request body is {limit + 1} bytes; the limit is {limit} "
                        f"(--max-request-bytes)" if how == "length" else
                        f"the request body is over the limit of {limit} bytes "
                        f"(--max-request-bytes)"), (path, how)
        wait_idle(state)
        check_clean(state)
        assert metric(url, "vllm:request_success_total") == 2
        assert logs.at_least(logging.WARNING) == []


# ---- the options --------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("client_timeout", 0), ("client_timeout", -1.5),
                                         ("client_timeout", float("inf")),
                                         ("max_request_bytes", 0), ("max_request_bytes", 1.5)])
def test_the_limits_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a positive"):
        ServeOptions(executor="sim", model=MODEL, **{field: value})


def test_the_limits_default_and_show_in_server_info():
    opts = ServeOptions(executor="sim", model=MODEL)
    assert (opts.client_timeout, opts.max_request_bytes) == (30.0, 64 << 20)
    state = build_server(ServeOptions(executor="sim", model=MODEL, client_timeout=2.5,
                                      max_request_bytes=1000), EngineConfig(kv_capacity=1000))
    assert (state.client_timeout, state.max_request_bytes) == (2.5, 1000)
    assert (state.info["client_timeout"], state.info["max_request_bytes"]) == (2.5, 1000)


def test_the_serve_flags_reach_the_server():
    """`radixkv serve --client-timeout 1 --max-request-bytes 2000`: /server_info shows both, a
    2001-byte body gets the 413, and a connection that sends nothing gets the 408 after 1 s."""
    from tests.server.test_serve_cli import start, stop
    proc, url = start("--executor", "sim", "--model", MODEL, "--client-timeout", "1",
                      "--max-request-bytes", "2000")
    try:
        info = httpx.get(url + "/server_info", timeout=10).json()
        assert (info["client_timeout"], info["max_request_bytes"]) == (1.0, 2000)
        r = httpx.post(url + "/v1/completions", content=_padded(2000, 1), timeout=10)
        assert r.status_code == 413 and r.json()["error"]["code"] == 413
        t0 = time.monotonic()
        s = raw_socket(url)
        try:
            got = read_to_eof(s, 10)
        finally:
            s.close()
        # the server's timer runs on its loop's clock, which libuv reads once per loop turn: it
        # can fire a fraction of a millisecond before a full second has passed here (0.9999 s)
        assert got.startswith(b"HTTP/1.1 408 ") and 0.9 <= time.monotonic() - t0 < 6
    finally:
        assert stop(proc) == 0
