"""The engine thread failing under load: every request in flight ends at once with an error
(a stream: one OpenAI error event, then [DONE]; a whole reply: 500), new requests and /health
get 503 naming the failure, and the requests' slots and locks are released. `radixkv serve
--exit-on-engine-failure` then exits 1 with one line on stderr; without it the server answers
503 until stopped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from radixkv import env
from radixkv.server.protocol import error_body
from tests.server._helpers import metric, on_engine, running_server
from tests.server.test_serve_cli import start

LONG = {"prompt": list(range(300)), "max_tokens": 4000, "ignore_eos": True}
FAILURE = "engine failure: RuntimeError: boom"


def _events(url: str, path: str, body: dict, out: list, key: str) -> None:
    """POST a streaming request; out gets (key, status, every `data:` payload)."""
    with httpx.Client(timeout=30) as h, h.stream("POST", f"{url}{path}", json=body) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        out.append((key, r.status_code, events))


def _whole(url: str, path: str, body: dict, out: list, key: str) -> None:
    r = httpx.post(f"{url}{path}", json=body, timeout=30)
    out.append((key, r.status_code, r.json()))


def _running(state, n: int, timeout: float = 20.0) -> None:
    """Wait until n requests are admitted and have produced a token each."""
    deadline = time.monotonic() + timeout
    while on_engine(state, lambda e: sum(len(r.output) > 0 for r in e.sched.running)) < n:
        assert time.monotonic() < deadline, "the requests did not start"
        time.sleep(0.02)


def test_inflight_requests_end_with_an_error_and_the_server_answers_503():
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        out: list = []
        jobs = [
            (_events, "/v1/completions", {"model": "llama-3-8b", **LONG, "stream": True}, "cmpl"),
            (_events, "/v1/chat/completions",
             {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi " * 50}],
              "max_tokens": 4000, "ignore_eos": True, "stream": True}, "chat"),
            (_events, "/generate", {"input_ids": list(range(200)), "stream": True,
                                    "sampling_params": {"max_new_tokens": 4000,
                                                        "ignore_eos": True}}, "sgl"),
            (_whole, "/v1/completions", {"model": "llama-3-8b", **LONG}, "whole"),
            (_whole, "/generate", {"input_ids": list(range(250)),
                                   "sampling_params": {"max_new_tokens": 4000,
                                                       "ignore_eos": True}}, "sgl-whole"),
        ]
        threads = [threading.Thread(target=fn, args=(url, path, body, out, key))
                   for fn, path, body, key in jobs]
        for t in threads:
            t.start()
        _running(state, len(jobs))
        state.worker.inject_failure(RuntimeError("boom"))
        for t in threads:
            t.join(15)
        assert not any(t.is_alive() for t in threads), "a request hung after the failure"
        got = {key: (status, body) for key, status, body in out}
        want = error_body(FAILURE, "server_error", None, 500)
        for key in ("cmpl", "chat", "sgl"):
            status, events = got[key]
            assert status == 200
            assert json.loads(events[-2]) == want and events[-1] == "[DONE]", (key, events[-3:])
            assert all("error" not in json.loads(e) for e in events[:-2])     # just one
        assert got["whole"] == (500, want)
        assert got["sgl-whole"] == (500, want)

        refused = error_body(FAILURE, "server_error", None, 503)
        r = httpx.post(f"{url}/v1/completions", json={"model": "llama-3-8b", "prompt": "hi"})
        assert (r.status_code, r.json()) == (503, refused)
        r = httpx.post(f"{url}/generate", json={"text": "hi"})
        assert (r.status_code, r.json()) == (503, refused)
        r = httpx.get(f"{url}/health")
        assert (r.status_code, r.json()) == (503, refused)
        for path in ("/server_info", "/get_load"):
            r = httpx.get(f"{url}{path}")
            assert (r.status_code, r.json()) == (503, refused), path
        assert metric(url, "radixkv_failed_requests_total") == len(jobs)
        assert metric(url, "radixkv_aborted_requests_total") == 0
        assert metric(url, "vllm:request_success_total") == 0
        assert metric(url, "vllm:num_requests_running") == 0
        assert metric(url, "vllm:num_requests_waiting") == 0
        assert not state.worker.alive() and state.worker.error == FAILURE
        state.worker.stop()                     # the thread has ended: the engine is ours now
        eng = state.worker.engine
        eng.manager.check()
        assert len(eng.manager.holders()) == 0
        assert eng.cache.protected_size() == 0
        assert eng.pool.used() == eng.cache.total_size() > 0      # the prefixes stay cached
        assert not eng.has_work()


def test_fault_after_steps_from_the_environment(monkeypatch):
    monkeypatch.setenv("RADIXKV_FAULT_AFTER_STEPS", "2")
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        r = httpx.post(f"{url}/v1/completions", timeout=30,
                       json={"model": "llama-3-8b", "prompt": "hello", "max_tokens": 50})
        message = "engine failure: RuntimeError: injected fault after 2 steps " \
                  "(RADIXKV_FAULT_AFTER_STEPS)"
        assert (r.status_code, r.json()) == (500, error_body(message, "server_error", None, 500))
        assert state.worker.engine.steps == 2


@pytest.mark.parametrize("raw, want", [(None, None), ("", None), ("0", 0), ("7", 7)])
def test_fault_after_steps_values(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("RADIXKV_FAULT_AFTER_STEPS", raising=False)
    else:
        monkeypatch.setenv("RADIXKV_FAULT_AFTER_STEPS", raw)
    assert env.fault_after_steps() == want


@pytest.mark.parametrize("raw", ["-1", "three", "1.5"])
def test_bad_fault_after_steps_is_refused_by_value(monkeypatch, raw):
    monkeypatch.setenv("RADIXKV_FAULT_AFTER_STEPS", raw)
    with pytest.raises(ValueError, match=f"RADIXKV_FAULT_AFTER_STEPS='{raw}'"):
        env.fault_after_steps()


# ---- the command line ------------------------------------------------------------------------
INJECTED = "engine failure: RuntimeError: injected fault after 3 steps (RADIXKV_FAULT_AFTER_STEPS)"


def _serve(*flags: str) -> tuple[subprocess.Popen, str]:
    old = os.environ.get("RADIXKV_FAULT_AFTER_STEPS")
    os.environ["RADIXKV_FAULT_AFTER_STEPS"] = "3"          # inherited by the subprocess
    try:
        return start("--executor", "sim", "--model", "llama-3-8b", *flags)
    finally:
        if old is None:
            del os.environ["RADIXKV_FAULT_AFTER_STEPS"]
        else:
            os.environ["RADIXKV_FAULT_AFTER_STEPS"] = old


def _stream_fails(url: str) -> None:
    out: list = []
    _events(url, "/v1/completions", {"model": "llama-3-8b", **LONG, "stream": True}, out, "s")
    _, status, events = out[0]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2]) == error_body(INJECTED, "server_error", None, 500)


def _stderr_lines(proc: subprocess.Popen) -> list[str]:
    return [line for line in proc.stderr.read().splitlines() if line.strip()]


def test_exit_on_engine_failure_exits_1_with_one_line():
    proc, url = _serve("--exit-on-engine-failure")
    try:
        _stream_fails(url)
        assert proc.wait(20) == 1
        assert _stderr_lines(proc) == [f"radixkv serve: {INJECTED}; exiting"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_the_flag_the_server_answers_503_until_stopped():
    proc, url = _serve()
    try:
        _stream_fails(url)
        refused = error_body(INJECTED, "server_error", None, 503)
        for _ in range(3):
            r = httpx.get(f"{url}/health", timeout=10)
            assert (r.status_code, r.json()) == (503, refused)
            time.sleep(0.3)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert _stderr_lines(proc) == [f"radixkv serve: {INJECTED}; answering 503 until stopped",
                                       "radixkv serve: stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_exit_on_engine_failure_with_replicas_is_refused_by_name():
    r = subprocess.run([sys.executable, "-m", "radixkv", "serve", "--port", "0", "--executor",
                        "sim", "--model", "llama-3-8b", "--replicas", "2",
                        "--exit-on-engine-failure"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("radixkv serve: error: --exit-on-engine-failure")
    assert len(r.stderr.strip().splitlines()) == 1


def test_regression_a_request_the_engine_refuses_says_why_and_the_engine_serves_on():
    """A request the app's checks passed but the engine refuses (its add_request raises) ends
    with its own reason — not "the engine failed", which it did not — and the next is served."""
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        eng = state.worker.engine
        add = eng.add_request

        def refuse(req):
            eng.add_request = add                      # only the first request
            raise ValueError("no room for it")
        eng.add_request = refuse
        body = {"model": "llama-3-8b", "prompt": list(range(20)), "max_tokens": 3}
        with httpx.Client(timeout=30) as h, \
                h.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert json.loads(events[-2]) == error_body("refused: no room for it", "server_error",
                                                    code=500)
        assert events[-1] == "[DONE]"
        ok = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(f"{url}/health").status_code == 200
