"""bench-serve with session arrivals: each later turn is sent its think time after the previous
turn's response completed, the first turns at their send times, against a fake server."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from radixkv.bench.client import BenchConfig, run_benchmark_async
from radixkv.workloads import TraceRequest, Workload
from radixkv.workloads.sessions import SessionArrivals

REPLY_S = 0.1           # how long the fake server takes over each request


def _req(name: str, k: int, session: str | None, arrival: float = 0.0) -> TraceRequest:
    return TraceRequest(name, arrival, (1, 2, k), output_len=2, session=session)


def _server(log: dict):
    """Answers each request after REPLY_S; log[last prompt id] = (received, answered)."""
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake"}]})
        body = json.loads(request.content)
        got = time.perf_counter()
        await asyncio.sleep(REPLY_S)
        chunk = json.dumps({"choices": [{"index": 0, "text": "t", "finish_reason": None}]})
        log[body["prompt"][-1]] = (got, time.perf_counter())
        return httpx.Response(200, text=f"data: {chunk}\n\ndata: {chunk}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})
    return httpx.MockTransport(handler)


WL = Workload("w", [_req("a0", 0, "a"), _req("b0", 1, "b"), _req("x", 2, None),
                    _req("a1", 3, "a"), _req("b1", 4, "b"), _req("a2", 5, "a")])


def _run(wl, **kw):
    log: dict = {}
    cfg = BenchConfig("http://fake", **kw)
    res = asyncio.run(run_benchmark_async(wl, cfg, transport=_server(log)))
    return res, log


def test_a_later_turn_waits_for_the_previous_reply_and_the_think_time():
    res, log = _run(WL, arrivals=SessionArrivals(0.1))
    assert res.summary["completed"] == 6 and res.summary["errors"] == 0
    for prev, nxt in ((0, 3), (3, 5), (1, 4)):
        assert log[nxt][0] >= log[prev][1] + 0.1
    # the first turns go together, at once: b0 and x do not wait for a0
    assert max(log[k][0] for k in (0, 1, 2)) < min(log[k][1] for k in (0, 1, 2))
    sent = {r.id: r.sent for r in res.records}
    assert sent["a2"] >= sent["a1"] + REPLY_S + 0.1 >= sent["a0"] + 2 * (REPLY_S + 0.1)


def test_trace_arrivals_send_every_turn_at_once():
    res, log = _run(WL, request_rate=float("inf"))
    assert res.summary["completed"] == 6
    assert max(got for got, _ in log.values()) < min(done for _, done in log.values())


def test_request_rate_spaces_the_first_turns_only():
    res, log = _run(WL, request_rate=10.0, arrivals=SessionArrivals(0.0))
    assert res.summary["completed"] == 6
    # three first turns arriving together: one every 0.1 s
    assert log[1][0] >= log[0][0] + 0.09 and log[2][0] >= log[1][0] + 0.09
    assert log[3][0] >= log[0][1]


def test_duration_limit_stops_a_session_run():
    t0 = time.perf_counter()
    res, log = _run(WL, arrivals=SessionArrivals(5.0), duration_limit=0.4)
    assert time.perf_counter() - t0 < 3
    s = res.summary
    assert (s["completed"], s["not_sent"]) == (3, 3) and set(log) == {0, 1, 2}


def test_session_arrivals_refuse_the_closed_loop():
    with pytest.raises(ValueError, match="--arrivals session is open loop"):
        BenchConfig("http://fake", max_concurrency=2, arrivals=SessionArrivals())
