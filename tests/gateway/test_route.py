"""`radixkv route` in front of radixkv sim workers on 127.0.0.1: where each request lands (each
worker's own success counter), streaming passed through, the gateway's prediction against what
the workers report, retries before the first byte, an error event after it, a worker's 4xx
unchanged, hang-ups cancelling upstream, health checks and fleet changes at run time."""
from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from radixkv.cli import main
from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.bridge import has_content
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.workers import load_figures
from radixkv.gateway.tokens import Tokens
from radixkv.kvevents.publisher import KVEventsConfig
from radixkv.router.base import RouterContext
from radixkv.server.launch import ServerThread
from radixkv.sim.costmodel import CostModel
from tests.server._helpers import check_clean, metric, running_server, wait_idle

MODEL = "llama-3-8b"
PREFIX = "You are the support agent of a parcel company. Answer briefly. " * 16
EVENTS = KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


@contextlib.contextmanager
def fleet(n: int = 2, events: bool = True):
    with contextlib.ExitStack() as st:
        yield [st.enter_context(running_server(executor="sim", model=MODEL, kv_capacity=20_000,
                                               kv_events=EVENTS if events else KVEventsConfig()))
               for _ in range(n)]


def sources(ws) -> dict:
    return {u: EventSource(s.info["kv_events"]["endpoint"], s.info["kv_events"]["replay_endpoint"])
            for u, s in ws}


@contextlib.contextmanager
def gateway(urls, router: str, events=None, tokenizer=None, options=None, **kw):
    gw = Gateway(urls, Routing(router, events=events, cost=CostModel.named(MODEL, "h100-sxm"),
                               options=options), Tokens(tokenizer), **kw)
    with ServerThread(build_gateway_app(gw)) as url:
        yield url, gw


def done(ws) -> list[int]:
    return [int(metric(u, "vllm:request_success_total")) for u, _ in ws]


def released(gw, limit: float = 5.0) -> None:
    """Wait until the gateway holds nothing of the streams it relayed: a client has the whole
    stream once the worker's last bytes are written to it, a turn of the gateway's loop before
    the relay ends and its request is forgotten."""
    deadline = time.monotonic() + limit
    while gw.relays or gw.routing.inflight.infos:
        assert time.monotonic() < deadline, (f"the gateway still holds {len(gw.relays)} relays "
                                             f"and {len(gw.routing.inflight.infos)} requests")
        time.sleep(0.01)


def gw_metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def series(url: str, name: str) -> list[tuple[str, float]]:
    """Every labelled series of `name` in the gateway's /metrics: (labels, value)."""
    out = []
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out.append((labels, float(value)))
    return out


def burst(url: str, n: int = 20, tag: str = "") -> list[int]:
    cached = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(n):
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": f"{PREFIX}{tag} q{i}?",
                                                "max_tokens": 3})
            assert r.status_code == 200, r.text
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    return cached


@pytest.mark.parametrize("router, events", [("radixkv", True), ("llm-d-precise", True),
                                            ("llm-d-precise", False),
                                            ("sglang-cache-aware", False)])
def test_a_shared_prefix_burst_lands_on_one_worker(router, events):
    with fleet(2, events) as ws:
        with gateway([u for u, _ in ws], router, sources(ws) if events else None) as (url, _):
            cached = burst(url)
            assert sorted(done(ws)) == [0, 20]
            assert cached[0] == 0 and min(cached[1:]) >= len(PREFIX.encode())
            predicted = gw_metric(url, "radixkv_route_predicted_cached_tokens_total")
            reported = gw_metric(url, "radixkv_route_reported_cached_tokens_total")
            assert reported == sum(cached)
            assert abs(predicted - reported) <= 20 * 0.1 * len(PREFIX)    # within 10 % each
            per_worker = sorted(v for k, v in series(url, "radixkv_route_requests_total"))
            assert per_worker == [20.0] and gw_metric(url, "radixkv_route_retries_total") == 0
            assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL
        for _, s in ws:
            wait_idle(s)
            check_clean(s)


def test_round_robin_alternates_and_streams_pass_through():
    with fleet(2, events=False) as ws, gateway([u for u, _ in ws], "round-robin") as (url, _):
        burst(url, 10)
        assert done(ws) == [5, 5]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            via, via_type = [ln for ln in r.iter_lines() if ln], r.headers["content-type"]
        with httpx.stream("POST", f"{ws[0][0]}/v1/chat/completions", json=body) as r:
            direct = [ln for ln in r.iter_lines() if ln]
        assert via_type == r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert len(via) == len(direct) == 9 and via[-1] == direct[-1] == "data: [DONE]"
        def same(lines):                # what does not depend on the request or the cache
            out = [{k: v for k, v in json.loads(ln[6:]).items() if k not in ("id", "created")}
                   for ln in lines[:-1]]
            out[-1]["usage"].pop("prompt_tokens_details")
            return out
        assert same(via) == same(direct)
        for path in ("/v1/completions", "/v1/chat/completions"):   # POST only
            r = httpx.get(f"{url}{path}")
            assert (r.status_code, r.json()["error"]["type"]) == (405, "invalid_request_error")
        assert done(ws) == [7, 5]          # the two streams on worker 0; the GETs sent nowhere


def test_text_and_chat_are_tokenized_by_the_workers_or_a_local_tokenizer(tmp_path):
    out = tmp_path / "tok"
    assert main(["tokenizer", str(out), "--model", MODEL]) == 0
    with fleet(2, events=True) as ws:
        for tok in (None, str(out)):
            with gateway([u for u, _ in ws], "radixkv", sources(ws), tokenizer=tok) as (url, _):
                burst(url, 6, tag=f"t{tok is None}")
                msgs = [{"role": "system", "content": PREFIX}, {"role": "user", "content": "hi"}]
                for _ in range(2):
                    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                                   json={"model": MODEL, "messages": msgs, "max_tokens": 2})
                    assert r.status_code == 200
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > len(PREFIX)
        assert sum(done(ws)) == 16


def test_regression_tokenizing_is_spread_over_the_workers_and_ids_ask_none():
    # every /tokenize went to the first healthy worker (2,424 calls against 0 on two vLLMs)
    with fleet(3, events=False) as ws, gateway([u for u, _ in ws], "round-robin") as (url, _):
        with httpx.Client(base_url=url, timeout=60) as c:
            for i in range(7):
                assert c.post("/v1/completions", json={"model": MODEL, "prompt": f"q{i}",
                                                       "max_tokens": 1}).status_code == 200
            assert c.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6, 7],
                                                   "max_tokens": 1}).status_code == 200
        asked = dict(series(url, "radixkv_route_tokenize_requests_total"))
        assert sorted(asked.values()) == [2.0, 2.0, 3.0] and len(asked) == 3


def test_regression_a_lone_surrogate_with_a_local_tokenizer_gets_the_workers_400(tmp_path):
    # was a 500: the local tokenizer raised on text that is not UTF-8
    out = tmp_path / "tok"
    assert main(["tokenizer", str(out), "--model", MODEL]) == 0
    h = {"content-type": "application/json"}
    with fleet(1, events=False) as ws:
        with gateway([u for u, _ in ws], "round-robin", tokenizer=str(out)) as (url, gw):
            for path, body in (("/v1/completions", b'{"prompt": "a\\ud800", "max_tokens": 1}'),
                               ("/v1/chat/completions", b'{"messages": [{"role": "user", '
                                                        b'"content": "\\ud800"}], "max_tokens": 1}')):
                r = httpx.post(url + path, content=body, headers=h, timeout=30)
                direct = httpx.post(ws[0][0] + path, content=body, headers=h, timeout=30)
                assert (r.status_code, r.json()) == (400, direct.json())
                assert "lone surrogate" in r.json()["error"]["message"]
        assert done(ws) == [0]


def test_a_refusing_worker_is_retried_once_and_a_4xx_comes_back_unchanged():
    with fleet(1, events=False) as ws:
        dead = "http://127.0.0.1:9"                      # nothing listens on the discard port
        gw = Gateway([ws[0][0]], Routing("round-robin"), Tokens(), health_interval=60)
        with ServerThread(build_gateway_app(gw)) as url:
            gw.routing.workers.append(type(gw.routing.workers[0])(dead, model=MODEL))
            gw.routing.build(gw.routing.workers)       # round-robin over [live, dead]
            burst(url, 6)
            assert done(ws) == [6]
            assert gw_metric(url, "radixkv_route_retries_total") == 3
            bad = {"model": MODEL, "prompt": "x", "max_tokens": 10**9}
            direct = httpx.post(f"{ws[0][0]}/v1/completions", json=bad)
            via = httpx.post(f"{url}/v1/completions", json=bad)
            assert via.status_code == direct.status_code == 400 and via.json() == direct.json()
            wrong = httpx.post(f"{url}/v1/completions", json={"model": "gpt-9", "prompt": "x"})
            assert wrong.status_code == 404 and "does not exist" in wrong.text
            assert httpx.post(f"{url}/v1/completions", content=b"{").status_code == 400
            for ids, bad_id in (([1, -1, 2], -1), ([2**32, 5], 2**32)):   # no hash takes it
                r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": ids})
                assert r.status_code == 400 and r.json()["error"]["message"] == \
                    f"prompt token id {bad_id} is outside [0, 2**32)"
            assert done(ws) == [6]                           # nothing of them reached it


def worker_app() -> FastAPI:
    """A fake worker that serves MODEL and answers its health checks; a test adds the rest."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": MODEL}]}

    @app.get("/health")
    async def health():
        return {}
    return app


def test_a_failure_after_the_first_byte_ends_the_stream_with_an_error_event():
    app = worker_app()

    @app.post("/tokenize")
    async def tokenize():
        return {"tokens": [1, 2, 3], "count": 3}

    @app.post("/v1/completions")
    async def broken():
        async def gen():
            yield b'data: {"choices": [{"text": "a"}]}\n\n'
            raise RuntimeError("the worker died")
        return StreamingResponse(gen(), media_type="text/event-stream")

    with ServerThread(app) as worker, gateway([worker], "round-robin") as (url, _):
        with httpx.stream("POST", f"{url}/v1/completions",
                          json={"model": MODEL, "prompt": "x", "stream": True}) as r:
            lines = [ln for ln in r.iter_lines() if ln]
        assert r.status_code == 200 and lines[0] == 'data: {"choices": [{"text": "a"}]}'
        assert json.loads(lines[1][6:])["error"]["code"] == 502 and lines[-1] == "data: [DONE]"
        assert gw_metric(url, 'radixkv_route_errors_total{kind="midstream"}') == 1


def test_a_lone_worker_that_fails_before_the_first_byte_is_tried_once_more():
    # regression: with one worker the retry had no other to go to (a 503, or a 502 from
    # tokenizing), though the failure was its pooled connection closed under the gateway
    app, calls = worker_app(), {"tokenize": 0, "completions": 0}

    @app.post("/tokenize")
    async def tokenize():
        calls["tokenize"] += 1
        if calls["tokenize"] == 1:
            return JSONResponse({"error": "busy"}, 500)
        return {"tokens": [1, 2, 3], "count": 3}

    @app.post("/v1/completions")
    async def completions():
        calls["completions"] += 1
        if calls["completions"] in (1, 3, 4):        # the third request fails twice: a 502
            return JSONResponse({"error": "busy"}, 503)
        return {"choices": [{"text": "ok"}]}

    with ServerThread(app) as worker, gateway([worker], "round-robin") as (url, _):
        r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert (r.status_code, r.json(), calls) == \
            (200, {"choices": [{"text": "ok"}]}, {"tokenize": 2, "completions": 2})
        r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": [7, 8]})
        assert r.status_code == 502 and calls["completions"] == 4          # tried twice, no more
        assert "the workers failed the request" in r.json()["error"]["message"]
        assert gw_metric(url, "radixkv_route_retries_total") == 2


def test_a_client_hang_up_cancels_the_upstream_request():
    with fleet(1, events=False) as ws, gateway([ws[0][0]], "least-load") as (url, _):
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": list(range(10, 200)), "max_tokens": 3000,
                "ignore_eos": True, "stream": True}) as r:
            it = r.iter_lines()
            assert next(ln for ln in it if ln).startswith("data: ")
        deadline = time.monotonic() + 5
        while metric(ws[0][0], "vllm:num_requests_running") != 0:
            assert time.monotonic() < deadline, "the worker still runs the abandoned request"
            time.sleep(0.05)
        assert metric(ws[0][0], "radixkv_aborted_requests_total") == 1
        wait_idle(ws[0][1])
        check_clean(ws[0][1])


def test_health_checks_and_the_fleet_at_run_time():
    with fleet(2, events=False) as ws:
        urls = [u for u, _ in ws]
        with gateway(urls, "round-robin", health_interval=0.2) as (url, gw):
            assert httpx.delete(f"{url}/workers/{urls[1]}").json() == {"removed": urls[1]}
            burst(url, 4)
            assert done(ws) == [4, 0]
            listed = httpx.get(f"{url}/workers").json()["workers"]
            assert [w["url"] for w in listed] == [urls[0]]
            added = httpx.post(f"{url}/workers", json={"url": urls[1]}).json()
            assert added["model"] == MODEL and added["page_size"] == 1
            burst(url, 4, tag="again")
            assert done(ws) == [6, 2]
            assert httpx.post(f"{url}/workers", json={"url": urls[1]}).status_code == 400
            assert httpx.delete(f"{url}/workers/http://127.0.0.1:1").status_code == 404
            gw.routing.workers[1].url = "http://127.0.0.1:9"     # the worker goes away
            deadline = time.monotonic() + 5
            while gw_metric(url, "radixkv_route_workers_healthy") != 1:
                assert time.monotonic() < deadline, "the dead worker stayed in the rotation"
                time.sleep(0.05)
            burst(url, 4, tag="after")
            assert done(ws) == [10, 2]
            assert gw_metric(url, "radixkv_route_retries_total") == 0


@pytest.mark.parametrize("argv, message", [
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "radixkv"],
     "--router radixkv prices each worker's queue: give --model NAME"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "radixkv-fit", "--profile",
      "/nonexistent/profile.json"], "/nonexistent/profile.json"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "round-robin", "--kv-events",
      "http://127.0.0.1:2=tcp://127.0.0.1:3"], "with URL one of --worker-urls"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "round-robin", "--kv-events",
      "http://127.0.0.1:1=udp://x"], "expected tcp://HOST:PORT"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "round-robin",
      "--approx-ttl", "0"], "--approx-ttl 0.0 is not a positive number"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "round-robin",
      "--client-timeout", "0"], "client_timeout must be a positive number, got 0.0"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "round-robin",
      "--max-request-bytes", "-5"], "max_request_bytes must be a positive"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "radixkv-fit",
      "--router-option", "radixkv.work_weight=1"], "router 'radixkv' is not among --router"),
    (["route", "--worker-urls", "http://127.0.0.1:1", "--router", "radixkv-fit",
      "--router-option", "radixkv-fit.fit_tie=-1"], "radixkv fit_tie must be a finite number"),
])
def test_bad_command_lines_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("radixkv route: error: ") and message in err and err.count("\n") == 1


def test_regression_a_worker_down_at_start_waits_out_of_the_rotation_and_bad_workers_are_refused():
    """The gateway starts with a worker that does not answer (it used to fail to start), sends
    nothing to it, and refuses a worker URL that is not one, naming it, with nothing changed."""
    with fleet(1, events=False) as ws:
        dead = "http://127.0.0.1:9"
        with gateway([ws[0][0], dead], "round-robin", health_interval=60) as (url, gw):
            assert [w["healthy"] for w in httpx.get(f"{url}/workers").json()["workers"]] == \
                [True, False]
            burst(url, 4)
            assert done(ws) == [4] and gw_metric(url, "radixkv_route_retries_total") == 0
            for bad in (123, "127.0.0.1:8000", None):
                r = httpx.post(f"{url}/workers", json={"url": bad})
                assert r.status_code == 400 and "a worker URL is http://HOST:PORT" in r.text
            assert httpx.post(f"{url}/workers", json={}).status_code == 400
            assert len(gw.routing.workers) == 2


def test_the_fitted_ttft_learns_from_streams_and_says_how_well_it_tracks_them():
    """With radixkv-fit every streamed request's TTFT (to its first content, not a chat's role
    chunk) reaches the fit; a whole response does not; /workers and /metrics report it."""
    with fleet(2) as ws, gateway([u for u, _ in ws], "radixkv-fit", sources(ws)) as (url, gw):
        with httpx.Client(base_url=url, timeout=60) as c:
            for i in range(6):
                body = {"model": MODEL, "max_tokens": 3, "stream": True}
                if i % 2:
                    body["messages"] = [{"role": "user", "content": f"{PREFIX} q{i}"}]
                    path = "/v1/chat/completions"
                else:
                    body["prompt"], path = f"{PREFIX} q{i}", "/v1/completions"
                with c.stream("POST", path, json=body) as r:
                    assert r.status_code == 200 and list(r.iter_lines())[-2] == "data: [DONE]"
            assert c.post("/v1/completions", json={"model": MODEL, "prompt": "whole",
                                                   "max_tokens": 2}).status_code == 200

        def stream(i: int) -> None:
            body = {"model": MODEL, "prompt": f"{PREFIX} c{i}", "max_tokens": 3, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200 and list(r.iter_lines())[-2] == "data: [DONE]"
        # regression: concurrent requests were chosen before the previous ones were recorded
        # (the router's last route overwritten), so their TTFTs never reached the fit
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(stream, range(8)))
        fit = httpx.get(f"{url}/workers").json()["ttft_fit"]
        assert fit["observations"] == 14 and fit["coefficients"]["own"] >= 0
        assert gw.routing.router.fit.seen == 14
        assert gw_metric(url, "radixkv_route_ttft_seconds_count") == 14
        assert gw_metric(url, "radixkv_route_ttft_fit_observations") == 14
        assert [k for k, _ in series(url, "radixkv_route_ttft_fit_abs_error")] == \
            ['{quantile="0.5"}', '{quantile="0.9"}']
        assert gw.routing.router.flying == [0, 0] and gw.routing.inflight.infos == {}
    with fleet(1) as ws, gateway([u for u, _ in ws], "radixkv", sources(ws)) as (url, _):
        assert "ttft_fit" not in httpx.get(f"{url}/workers").json()      # nothing fitted


def test_first_content_is_told_from_a_role_chunk_and_load_lines_from_the_rest():
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    text = b'data: {"choices":[{"index":0,"text":"Hi","finish_reason":null}]}\n\n'
    chat = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    assert not has_content(role) and not has_content(b"") and not has_content(b": ping\n\n")
    assert has_content(text) and has_content(role + chat) and has_content(b"data: [DONE]\n\n")
    assert not has_content(text[:30])                    # a line cut across chunks: not yet
    assert has_content(b'data: {"error":{"message":"x"}}\n\n')
    assert not has_content(b'data: {"choices":7}\n\ndata: [1,2]\n\n')
    exposition = "\n".join([
        "# HELP vllm:num_requests_running Requests running", "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="m"} 3.0', 'vllm:num_requests_waiting{model_name="m"} 1',
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25', "vllm:num_requests_running_other 9",
        'vllm:e2e_request_latency_seconds_bucket{le="0.1"} 4.0', "sglang:num_queue_reqs 2"])
    assert load_figures(exposition) == {"vllm:num_requests_running": 3.0,
                                        "vllm:num_requests_waiting": 1.0,
                                        "vllm:kv_cache_usage_perc": 0.25,
                                        "sglang:num_queue_reqs": 2.0}


def test_router_options_reach_the_gateways_router():
    from radixkv.cli import build_parser
    from radixkv.commands.route import build
    from radixkv.router.radixkv import RadixKVOptions
    args = build_parser().parse_args(["route", "--worker-urls", "http://127.0.0.1:1", "--router",
                                      "radixkv-fit", "--router-option", "radixkv-fit.fit_tie=0.1",
                                      "--router-option", "radixkv-fit.decode_weight=1"])
    routing = build(args).state.gateway.routing
    assert routing.options == RadixKVOptions(fit=True, fit_tie=0.1, decode_weight=1.0)
    routing.build([])                          # the router it builds runs on them
    assert routing.router.options is routing.options


def test_the_gateways_router_hashes_prompts_without_the_in_process_memo():
    # regression: the per-page memo only pays where the caches run in this process; the
    # gateway's are remote, and every fresh page cost twice to hash through it
    routing = Routing("radixkv", cost=CostModel.named(MODEL, "h100-sxm"))
    routing.build([])
    assert routing.router.context.hash_memo is False
    assert RouterContext(2).hash_memo is True                  # the simulator keeps it


def test_the_gateway_predicts_from_the_routers_index_and_keeps_its_own_only_without_one():
    # regression: every KV event batch was applied twice, to the router's index and to a
    # copy of the gateway's, on the gateway's event loop
    from radixkv.kvevents.wire import AllBlocksCleared, BlockStored, KVEventBatch
    from radixkv.router.base import RequestInfo
    from radixkv.gateway.workers import Worker
    workers = [Worker("http://127.0.0.1:1", model=MODEL), Worker("http://127.0.0.1:2", model=MODEL)]
    info = RequestInfo("r", [5, 6, 7, 8, 9], (None, None))
    for name, shared in (("llm-d-precise", True), ("round-robin", False)):
        routing = Routing(name)
        routing.build(workers)
        try:
            hashes = routing.router.page_hashes(info)
            batch = KVEventBatch(0.0, [BlockStored(hashes[:3], None, [5, 6, 7], 1, None, None)])
            routing.on_events(1, batch)
            assert [routing.indexes[i] is routing.router.held_index(i) for i in (0, 1)] == \
                [shared, shared]
            assert (routing.predicted(0, info), routing.predicted(1, info)) == (0, 3)
            routing.on_events(1, KVEventBatch(0.0, [AllBlocksCleared()]))
            assert routing.predicted(1, info) == 0
        finally:
            routing.close()
