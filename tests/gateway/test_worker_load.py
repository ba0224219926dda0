"""How loaded the gateway sees each worker: SGLang's `/get_load` where the worker serves it (radixkv
does), else the worker's `/metrics` (vLLM's names); the figures `/workers` shows against what the
worker itself says, and a malformed answer that changes nothing."""
from __future__ import annotations

import contextlib
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from radixkv.gateway.workers import sglang_load
from radixkv.server.launch import ServerThread
from tests.gateway.test_route import MODEL, fleet, gateway, worker_app
from tests.server._helpers import check_clean, wait_idle


def test_sglang_load_sums_the_ranks_and_counts_the_waiting_apart():
    ranks = [{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 100},
             {"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0, "num_tokens": 7}]
    assert sglang_load(ranks) == (4, 2, 107)
    assert sglang_load([{"num_reqs": 0, "num_waiting_reqs": 0}]) == (0, 0, 0)
    with pytest.raises(KeyError):
        sglang_load([{"num_waiting_reqs": 1}])


def described(url: str) -> dict:
    return httpx.get(f"{url}/workers").json()["workers"][0]


def wait_for(url: str, check, seconds: float = 10.0) -> dict:
    deadline = time.monotonic() + seconds
    while not check(w := described(url)):
        assert time.monotonic() < deadline, f"the gateway still shows {w}"
        time.sleep(0.05)
    return w


def test_a_radixkv_worker_is_read_through_get_load():
    with fleet(1, events=False) as ws, \
            gateway([ws[0][0]], "least-load", scrape_interval=0.05) as (url, _), \
            contextlib.ExitStack() as st:
        (wurl, server), = ws
        assert described(url)["load_from"] == "/get_load"
        client = st.enter_context(httpx.Client(base_url=url, timeout=60))
        lines = []                     # each stream's line iterator, kept: a dropped one closes it
        for i in range(3):                       # three long streams held open
            r = st.enter_context(client.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": list(range(10 + i, 200)), "max_tokens": 3000,
                "ignore_eos": True, "stream": True}))
            lines.append(r.iter_lines())
            assert next(ln for ln in lines[-1] if ln).startswith("data: ")
        w = wait_for(url, lambda w: w.get("running") == 3)
        load = httpx.get(f"{wurl}/get_load").json()[0]
        assert (w["running"], w["waiting"]) == (load["num_reqs"] - load["num_waiting_reqs"],
                                                load["num_waiting_reqs"]) == (3, 0)
        assert 190 + 189 + 188 <= w["kv_used"] <= 190 + 189 + 188 + 3 * 3000   # their prompts and more
        assert w["kv_capacity"] == 20_000
        st.close()                                # the clients hang up: the worker aborts
        wait_for(url, lambda w: w.get("running") == 0)
        wait_idle(server)
        check_clean(server)


def fake_worker(exposition: str, get_load=None) -> FastAPI:
    app = worker_app()

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(exposition)

    if get_load is not None:
        @app.get("/get_load")
        async def load():
            return get_load
    return app


VLLM = "\n".join([
    '# TYPE vllm:cache_config_info gauge',
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0',
    'vllm:num_requests_running{model_name="m"} 3.0',
    'vllm:num_requests_waiting{model_name="m"} 1.0',
    'vllm:kv_cache_usage_perc{model_name="m"} 0.25'])


def test_a_worker_without_get_load_is_read_through_its_metrics():
    with ServerThread(fake_worker(VLLM)) as worker, \
            gateway([worker], "least-load", scrape_interval=0.05) as (url, _):
        w = wait_for(url, lambda w: "running" in w)
        assert w["load_from"] == "/metrics" and w["page_size"] == 16
        assert {k: w[k] for k in ("running", "waiting", "kv_used", "kv_capacity")} == \
            {"running": 3, "waiting": 1, "kv_used": 400, "kv_capacity": 1600}


def test_a_malformed_get_load_answer_changes_nothing():
    with ServerThread(fake_worker(VLLM, get_load=[{"dp_rank": 0}])) as worker, \
            gateway([worker], "least-load", scrape_interval=0.05) as (url, gw):
        time.sleep(0.5)                           # ten scrapes
        w = described(url)
        assert w["load_from"] == "/get_load" and w["healthy"]
        assert "running" not in w and gw.routing.workers[0].figures == {}
