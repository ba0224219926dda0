"""A real vLLM worker SIGKILLed mid-stream behind `radixkv route` (two workers, KV events on):
its streams end with an error event and `[DONE]` (the other worker's run to their end), a
request sent right after is served by the other worker, and the dead worker leaves the
rotation with what it held forgotten."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx

from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.tokens import Tokens
from radixkv.router import RequestInfo
from radixkv.server.launch import ServerThread
from radixkv.sim.costmodel import CostModel
from tests.realengine.workers import SERVED_NAME, VllmWorkers

PREFIX = list(range(1000, 1640))                 # 20 blocks every request shares
HEALTH_S, FAILURES = 1.0, 2


class Stream(threading.Thread):
    """One streamed completion through the gateway, read to its end: its data lines."""

    def __init__(self, url: str, ids: list[int], max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.ids, self.max_tokens = url, ids, max_tokens
        self.lines: list[str] = []
        self.status = self.error = None
        self.ended = 0.0
        self.begun = threading.Event()

    def run(self) -> None:
        body = {"model": SERVED_NAME, "prompt": self.ids, "max_tokens": self.max_tokens,
                "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body,
                              timeout=60) as r:
                self.status = r.status_code
                for ln in r.iter_lines():
                    if ln:
                        self.lines.append(ln)
                        self.begun.set()
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.ended = time.monotonic()
            self.begun.set()


def finished(url: str) -> int:
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
                   if ln.startswith("vllm:request_success_total")))


def running(url: str) -> int:
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
                   if ln.startswith("vllm:num_requests_running")))


def healthy(url: str) -> dict[str, bool]:
    return {w["url"]: w["healthy"] for w in httpx.get(f"{url}/workers").json()["workers"]}


def test_a_vllm_worker_killed_mid_stream_fails_its_streams_and_is_routed_around(
        real_engine, tmp_path):
    with VllmWorkers(2, kv_tokens=8192, log_dir=tmp_path) as ws:
        routing = Routing("radixkv-fit", cost=CostModel.named("llama-3-8b", "h100-sxm"),
                          events={w.url: EventSource(w.events, w.replay) for w in ws})
        gw = Gateway([w.url for w in ws], routing, Tokens(None), health_interval=HEALTH_S,
                     failures_to_leave=FAILURES)
        with ServerThread(build_gateway_app(gw)) as url, httpx.Client(base_url=url,
                                                                      timeout=60) as c:
            r = c.post("/v1/completions", json={"model": SERVED_NAME, "max_tokens": 1,
                                                "prompt": PREFIX + [5]})
            assert r.status_code == 200, r.text
            a = next(i for i, w in enumerate(ws) if finished(w.url) == 1)
            ua, ub = ws[a].url, ws[1 - a].url
            deadline = time.monotonic() + 10           # A's blocks reach the gateway
            probe = RequestInfo("probe", PREFIX, (None, None))
            while routing.predicted(a, probe) == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            streams, on = [Stream(url, PREFIX + [10 + i], 2000) for i in range(3)], []
            for s in streams:                          # which worker each stream runs on
                was = [running(w.url) for w in ws]
                s.start()
                assert s.begun.wait(30) and s.lines, (s.status, s.error)
                now = [running(w.url) for w in ws]
                on.append(next(i for i in (0, 1) if now[i] > was[i]))
            assert a in on, on                         # the shared prefix's worker streams
            os.killpg(ws[a].pid, signal.SIGKILL)       # the worker and its engine processes
            killed = time.monotonic()
            for s in (s for s, i in zip(streams, on) if i == a):   # an error event, [DONE]
                s.join(30)
                assert not s.is_alive() and s.status == 200 and s.error is None, s.error
                assert s.lines[-1] == "data: [DONE]"
                last = json.loads(s.lines[-2][6:])
                assert last["error"]["code"] == 502 and "mid-stream" in last["error"]["message"]
            to_error = max(s.ended for s, i in zip(streams, on) if i == a) - killed
            before = finished(ub)
            r = c.post("/v1/completions", json={"model": SERVED_NAME, "max_tokens": 1,
                                                "prompt": PREFIX + [99]})
            assert r.status_code == 200, r.text
            assert finished(ub) == before + 1
            while healthy(url)[ua] and time.monotonic() - killed < 10:
                time.sleep(0.1)
            to_leave = time.monotonic() - killed
            assert healthy(url) == {ua: False, ub: True}
            assert len(routing.indexes[a]) == 0                 # what A held is forgotten
            for s in (s for s, i in zip(streams, on) if i != a):   # B's run to their end
                s.join(60)
                assert s.lines[-1] == "data: [DONE]" and s.error is None
                assert json.loads(s.lines[-2][6:])["choices"][0]["finish_reason"] == "length"
        print(f"{on.count(a)} streams on the killed worker ended {to_error:.2f} s after the kill; "
              f"out of the rotation after {to_leave:.2f} s")
