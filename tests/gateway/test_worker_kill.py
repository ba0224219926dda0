"""`radixkv route` in front of `radixkv serve --executor sim` worker subprocesses (KV events on),
one of them killed with SIGKILL while it streams: its streams end with an error event, a request
sent before the health check notices is retried on the other worker, the health check takes the
dead one out of the rotation and the router forgets its pages; restarted on the same port (and
the same event sockets) it rejoins the rotation holding nothing."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time

import httpx

from radixkv.bench.process import ServerProcess
from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.tokens import Tokens
from radixkv.server.launch import ServerThread
from radixkv.sim.costmodel import CostModel
from tests.server._helpers import READ_S, Stream, metric, wait_for

MODEL = "llama-3-8b"
PREFIX = "You are the support agent of a parcel company. Answer briefly. " * 16
HEALTH_S, FAILURES = 1.0, 2          # a dead worker leaves after 1 to 2 intervals


def worker(endpoint: str = "tcp://127.0.0.1:*", replay: str = "tcp://127.0.0.1:*",
           port: int = 0) -> ServerProcess:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
              "replay_endpoint": replay}
    proc = ServerProcess(["--executor", "sim", "--model", MODEL, "--enable-metrics",
                          "--kv-events-config", json.dumps(events)])
    proc.cmd[proc.cmd.index("--port") + 1] = str(port)
    return proc


def events_of(url: str) -> EventSource:
    ev = httpx.get(f"{url}/server_info", timeout=10).json()["kv_events"]
    return EventSource(ev["endpoint"], ev["replay_endpoint"])


def running(url: str) -> int:
    return int(metric(url, "vllm:num_requests_running"))


def listed(url: str) -> dict[str, bool]:
    return {w["url"]: w["healthy"] for w in httpx.get(f"{url}/workers").json()["workers"]}


def gw_metric(url: str, sample: str) -> float:
    """One sample of the gateway's /metrics, named with its labels (0 when absent)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def pages(gw: Gateway, i: int) -> tuple[int, int]:
    """Pages the router's index and the gateway's own index attribute to worker i."""
    with gw.routing.lock:
        return len(gw.routing.router.index.indexes[i]), len(gw.routing.indexes[i])


def test_a_worker_killed_mid_stream_fails_its_streams_is_retried_around_and_rejoins(caplog):
    caplog.set_level(logging.INFO, logger="radixkv.gateway")
    procs = [worker(), worker()]
    try:
        urls = [p.start() for p in procs]
        events = {u: events_of(u) for u in urls}
        routing = Routing("radixkv-fit", events=events, cost=CostModel.named(MODEL, "h100-sxm"))
        gw = Gateway(urls, routing, Tokens(), health_interval=HEALTH_S, failures_to_leave=FAILURES)
        with ServerThread(build_gateway_app(gw)) as url, \
                httpx.Client(base_url=url, timeout=30) as c:
            # ---- the shared prefix lands on one worker: A ------------------------------------
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": f"{PREFIX} warm",
                                                "max_tokens": 2})
            assert r.status_code == 200
            a = next(i for i, u in enumerate(urls)
                     if metric(u, "vllm:request_success_total") == 1)
            b, ua, ub = 1 - a, urls[a], urls[1 - a]
            wait_for("A's pages reach the router", lambda: pages(gw, a)[0] > 0, 10)
            on_a = [Stream(url, f"{PREFIX} s{i}", 4000).started() for i in range(3)]
            assert running(ua) == 3 and running(ub) == 0
            on_b = Stream(url, "Write a short poem about parcels and their long journeys.",
                          300).started()
            assert running(ua) == 3 and running(ub) == 1
            # ---- SIGKILL A ---------------------------------------------------------------------
            pid_a = procs[a].proc.pid
            os.kill(pid_a, signal.SIGKILL)
            killed = time.monotonic()
            assert procs[a].proc.wait(10) == -signal.SIGKILL
            for s in on_a:
                s.join(READ_S + 1)
                assert not s.is_alive()
            to_error = [s.ended - killed for s in on_a]
            for s in on_a:                       # an error event, then [DONE]; no transport error
                assert s.status == 200 and s.error is None, s.error
                assert s.lines[-1] == "data: [DONE]"
                err = json.loads(s.lines[-2][6:])["error"]
                assert err["code"] == 502 and "mid-stream" in err["message"]
                assert all("error" not in json.loads(ln[6:]) for ln in s.lines[:-2])
            assert max(to_error) < 5.0, to_error
            # ---- before the health check notices: routed to A, retried on B --------------------
            assert listed(url)[ua] is True
            sent_a = gw_metric(url, f'radixkv_route_requests_total{{worker="{ua}"}}')
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": f"{PREFIX} after",
                                                "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert gw_metric(url, f'radixkv_route_requests_total{{worker="{ua}"}}') == sent_a + 1
            assert gw_metric(url, "radixkv_route_retries_total") == 1
            assert gw_metric(url, 'radixkv_route_errors_total{kind="midstream"}') == 3
            assert metric(ub, "vllm:request_success_total") == 1
            # ---- the health check takes A out; the router forgets what A held ------------------
            wait_for("A leaves the rotation", lambda: listed(url)[ua] is False, 10)
            to_leave = time.monotonic() - killed
            assert to_leave <= HEALTH_S * (FAILURES + 1) + 1.0, to_leave
            assert listed(url) == {ua: False, ub: True}
            assert pages(gw, a) == (0, 0)
            with gw.routing.lock:
                router = gw.routing.router
                assert not router.inflight[a] and router.inflight[a].distinct() == 0 \
                    and router.flying[a] == 0
                assert gw.routing.inflight.on(a) == []
            held_b = pages(gw, b)
            assert held_b[0] > 0 and held_b[0] == held_b[1]      # the retried prefix, on B
            # ---- B's stream was never touched -------------------------------------------------
            on_b.join(READ_S + 1)
            assert on_b.status == 200 and on_b.error is None and on_b.lines[-1] == "data: [DONE]"
            assert json.loads(on_b.lines[-2][6:])["usage"]["completion_tokens"] == 300
            # ---- A restarted on the same port and event sockets: empty, back in the rotation ---
            procs[a] = worker(events[ua].endpoint, events[ua].replay, int(ua.rsplit(":", 1)[1]))
            assert procs[a].start() == ua
            to_rejoin = wait_for("A rejoins the rotation", lambda: listed(url)[ua] is True, 10)
            assert pages(gw, a) == (0, 0)
            busy = Stream(url, f"{PREFIX} busy", 400).started()        # on B: it holds PREFIX
            assert running(ub) == 1 and running(ua) == 0
            r = c.post("/v1/completions", json={"model": MODEL, "max_tokens": 2,
                                                "prompt": "A fresh question about a lost parcel."})
            assert r.status_code == 200
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert metric(ua, "vllm:request_success_total") == 1       # the new process served it
            wait_for("A's new pages reach the router", lambda: pages(gw, a)[0] > 0, 10)
            busy.join(READ_S + 1)
            assert busy.lines[-1] == "data: [DONE]"
        print(f"time to the error event {[round(t, 3) for t in to_error]} s, out of the rotation "
              f"after {to_leave:.2f} s, back {to_rejoin:.2f} s after the restart")
        logged = [r.getMessage() for r in caplog.records if r.name.startswith("radixkv.gateway")]
        print("\n".join(logged))
        assert sum(f"{ua}" in m and "mid-stream" in m for m in logged) == 3
        assert any(f"{ua}" in m and "retry" in m for m in logged)
        assert any(f"{ua}" in m and "out of the rotation" in m for m in logged)
        assert any(f"{ua}" in m and "back in the rotation" in m for m in logged)
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop()
