"""`radixkv route` meets hostile clients as `radixkv serve` does (server/guard.py): a body over
`max_request_bytes` is a 413 that no worker sees, with a Content-Length or chunked; a client that
stops reading a relayed stream is dropped after `client_timeout`, and the upstream request is
closed, so the worker aborts it and frees everything."""
from __future__ import annotations

import json
import logging
import socket

import httpx

from radixkv.gateway.core import Routing
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.tokens import Tokens
from radixkv.server.launch import ServerThread
from tests.server._helpers import check_clean, metric, running_server, wait_for, wait_idle
from tests.server._hostile import post_bytes, raw_socket, read_to_eof, sse_texts

MODEL = "llama-3-8b"


def test_a_body_over_the_limit_is_a_413_no_worker_sees():
    with running_server(executor="sim", model=MODEL) as (w, state):
        gw = Gateway([w], Routing("round-robin"), Tokens(None), max_request_bytes=4096)
        with ServerThread(build_gateway_app(gw)) as url:
            ok = json.dumps({"model": MODEL, "prompt": "x" * 100, "max_tokens": 1}).encode()
            big = json.dumps({"model": MODEL, "prompt": "x" * 4100, "max_tokens": 1}).encode()
            head = {"content-type": "application/json"}
            sized = httpx.post(f"{url}/v1/completions", content=big, headers=head)
            chunked = httpx.post(f"{url}/v1/completions", headers=head,
                                 content=iter([big[:3000], big[3000:]]))
            passed = httpx.post(f"{url}/v1/completions", content=ok, headers=head, timeout=30)
        for r in (sized, chunked):
            assert r.status_code == 413 and r.json()["error"]["code"] == 413, r.text
            assert "4096" in r.json()["error"]["message"]
        assert passed.status_code == 200
        assert metric(w, "vllm:request_success_total") == 1         # only the one that passed
        wait_idle(state)
        check_clean(state)


def test_a_reader_that_stops_reading_is_dropped_and_its_upstream_request_aborted(caplog):
    """The stalled client sees a prefix of the stream, then the gateway closes the connection
    (no [DONE]); the gateway closes its upstream request, the worker aborts it and holds
    nothing; the gateway logs one warning naming the timeout."""
    with running_server(executor="sim", model=MODEL, gpu="h200") as (w, state):
        gw = Gateway([w], Routing("round-robin"), Tokens(None), client_timeout=2.0)
        srv = ServerThread(build_gateway_app(gw), client_timeout=2.0)
        srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)   # accepted ones too
        with caplog.at_level(logging.WARNING, logger="radixkv.server.guard"), srv as url:
            s = raw_socket(url, rcvbuf=4096)
            try:
                s.sendall(post_bytes({"model": MODEL, "prompt": "hello", "max_tokens": 8000,
                                      "ignore_eos": True, "stream": True}))
                wait_for("the worker to run it",
                         lambda: metric(w, "vllm:num_requests_running") == 1, 20)
                took = wait_for("the worker's abort",
                                lambda: metric(w, "radixkv_aborted_requests_total") == 1, 60)
                got = read_to_eof(s)
            finally:
                s.close()
        assert took < 60
        assert got.startswith(b"HTTP/1.1 200 OK") and b"[DONE]" not in got
        texts, reasons = sse_texts(got)
        assert len(texts) > 100 and set(reasons) == {None}
        assert metric(w, "vllm:request_success_total") == 0
        wait_idle(state)
        check_clean(state)
        drops = [r.getMessage() for r in caplog.records if r.name == "radixkv.server.guard"]
        assert len(drops) == 1 and "did not read the response for 2s" in drops[0], drops
