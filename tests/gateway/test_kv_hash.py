"""The page hashes the gateway looks prompts up by: the ones the workers say their KV events
carry (radixkv's /server_info, vLLM's `vllm:cache_config_info`), or `--kv-hash`; and the check
that says, once in the log and on /metrics, when a worker's events never hold what it is sent."""
from __future__ import annotations

import logging
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from radixkv.cli import main
from radixkv.gateway import hash_check
from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.hash_check import WARN_AFTER, HashCheck
from radixkv.gateway.workers import Worker
from radixkv.kvevents import vllm_hash
from radixkv.router.base import RequestInfo
from radixkv.server.launch import ServerThread
from tests.gateway.test_route import MODEL, fleet, gateway, gw_metric, series, sources

PROMPT = list(range(100, 164))                      # two 32-token blocks


def built(workers, **kw) -> Routing:
    routing = Routing("llm-d-precise", **kw)
    routing.build(workers)
    return routing


def test_vllm_workers_are_looked_up_by_vllms_hashes():
    routing = built([Worker("http://a", model=MODEL, page_size=32, hash_scheme="vllm-sha256"),
                     Worker("http://b", model=MODEL, page_size=32, hash_scheme="vllm-sha256")])
    info = RequestInfo("r", PROMPT, (None, "salt"))
    assert routing.router.context.hash_algo == "vllm-sha256"
    assert routing.router.page_hashes(info).all() == vllm_hash.block_hashes(PROMPT, 32,
                                                                            cache_salt="salt")
    routing.close()


def test_the_flag_wins_and_unknown_workers_take_radixkvs():
    w = [Worker("http://a", page_size=32, hash_scheme="vllm-sha256")]
    assert built(w, hash_algo="vllm-sha256-cbor").router.context.hash_algo == "vllm-sha256-cbor"
    assert built([Worker("http://a", page_size=32)]).router.context.hash_algo == "sha256"


def test_a_fleet_of_two_hashes_and_a_bad_name_are_refused():
    with pytest.raises(ValueError, match=r"different hashes \(\['sha256', 'vllm-sha256'\]\)"):
        built([Worker("http://a", page_size=32, hash_scheme="vllm-sha256"),
               Worker("http://b", page_size=32, hash_scheme="sha256")])
    with pytest.raises(ValueError, match="unknown hash 'sha1'"):
        Routing("llm-d-precise", hash_algo="sha1")


def test_the_check_warns_once_naming_the_cause(caplog):
    caplog.set_level(logging.WARNING, "radixkv.gateway.hash_check")
    other, silent = HashCheck("http://a", "tcp://127.0.0.1:1"), HashCheck("http://b", "tcp://x:2")
    for k in range(WARN_AFTER):
        other.sent(k, 0.0)
        silent.sent(k, 0.0)
    other.check(set(), 1.0, batches=5)                  # not settled yet: nothing checked
    assert other.counts() == (0, 0, False)
    other.check({999}, 10.0, batches=5)
    silent.check(set(), 10.0, batches=0)
    other.check(set(), 11.0, batches=5)                 # said once
    assert other.counts() == (0, WARN_AFTER, True) and silent.counts().mismatch
    assert [r.getMessage().split(": ")[0] for r in caplog.records] == [
        f"none of {WARN_AFTER} prompts sent to http://a showed up in its KV events",
        f"no KV event has arrived from http://b at tcp://x:2 after {WARN_AFTER} prompts"]
    found = HashCheck("http://c", "e")
    found.sent(7, 0.0)
    for k in range(2 * WARN_AFTER):
        found.sent(k + 100, 0.0)
    found.check({7}, 10.0, batches=1)                   # one found: the hashes are the worker's
    assert found.counts() == (1, 2 * WARN_AFTER, False)


@pytest.mark.parametrize("given, mismatch", [(None, 0.0), ("vllm-sha256", 1.0)])
def test_a_worker_whose_events_never_hold_its_prompts_is_named_on_metrics(monkeypatch, given,
                                                                          mismatch):
    monkeypatch.setattr(hash_check, "SETTLE_S", 0.2)
    with fleet(1) as ws, gateway([u for u, _ in ws], "llm-d-precise", sources(ws),
                                 ) as (url, gw):
        gw.routing.hash_given = given
        gw.routing.build(gw.routing.workers)
        with httpx.Client(base_url=url, timeout=60) as c:
            for i in range(WARN_AFTER + 2):
                r = c.post("/v1/completions", json={"model": MODEL, "max_tokens": 2,
                                                    "prompt": f"prompt {i} " * 40})
                assert r.status_code == 200, r.text
                time.sleep(0.25)
        found = gw_metric(url, "radixkv_route_kv_events_prompts_found_total")
        missing = gw_metric(url, "radixkv_route_kv_events_prompts_missing_total")
        assert series(url, "radixkv_route_kv_events_hash_mismatch") == [
            (f'{{worker="{ws[0][0]}"}}', mismatch)]
        if given is None:                                 # radixkv's hashes: every one found
            assert (found, missing) == (WARN_AFTER + 1, 0)
        else:
            assert (found, missing) == (0, WARN_AFTER + 1)


def fake_vllm(algo: str) -> FastAPI:
    """A worker answering as vLLM does: /v1/models and the cache's configuration in /metrics,
    no /server_info."""
    app = FastAPI()
    app.get("/v1/models")(lambda: {"data": [{"id": "tiny-llama"}]})
    app.get("/health")(lambda: {})
    info = (f'vllm:cache_config_info{{block_size="32",num_gpu_blocks="256",'
            f'prefix_caching_hash_algo="{algo}",enable_prefix_caching="True"}} 1.0\n')
    app.get("/metrics")(lambda: PlainTextResponse("# TYPE vllm:cache_config_info gauge\n" + info))
    return app


@pytest.mark.parametrize("algo, scheme", [("sha256", "vllm-sha256"),
                                          ("sha256_cbor", "vllm-sha256-cbor"), ("xxhash", None)])
def test_a_vllm_worker_says_its_hashes_in_its_cache_config(algo, scheme):
    with ServerThread(fake_vllm(algo)) as wurl, gateway([wurl], "round-robin") as (url, gw):
        (w,) = httpx.get(f"{url}/workers").json()["workers"]
        assert (w["page_size"], w["kv_capacity"], w["kv_hash"]) == (32, 8192, scheme)
        assert gw.routing.router.context.hash_algo == (scheme or "sha256")


def test_bad_kv_hash_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["route", "--worker-urls", "http://127.0.0.1:1", "--kv-hash", "md5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "argument --kv-hash: invalid choice: 'md5' (choose from 'sha256', " in err


def test_a_vllm_publisher_that_connects_is_subscribed_by_binding(tmp_path):
    # regression: with vLLM's publisher on tcp://127.0.0.1:P (where vLLM connects) the gateway
    # connected too, and nothing flowed, with no error: --kv-events-bind binds it
    import socket

    import zmq

    from radixkv.kvevents.wire import BlockStored, encode_batch
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    hashes = vllm_hash.block_hashes(PROMPT, 32)
    payload = encode_batch(time.time(), [BlockStored(hashes, None, PROMPT, 32, None, "GPU")])
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)                                  # as vLLM's publisher does
    try:
        with ServerThread(fake_vllm("sha256")) as wurl, \
                gateway([wurl], "llm-d-precise",
                        {wurl: EventSource(endpoint, bind=True)}) as (url, gw):
            (w,) = httpx.get(f"{url}/workers").json()["workers"]
            assert w["engine"] == "vllm" and gw.routing.feeds[0].bind
            info = RequestInfo("r", PROMPT, (None, None))
            deadline, seq = time.monotonic() + 10, 0
            while gw.routing.predicted(0, info) == 0 and time.monotonic() < deadline:
                pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])
                seq += 1
                time.sleep(0.1)
            assert gw.routing.predicted(0, info) == 64        # both blocks, found by vLLM's hashes
    finally:
        pub.close()


def test_a_radixkv_worker_binds_and_is_connected_to():
    with fleet(1) as ws, gateway([u for u, _ in ws], "llm-d-precise", sources(ws)) as (url, gw):
        (w,) = httpx.get(f"{url}/workers").json()["workers"]
        assert (w["engine"], w["kv_hash"], gw.routing.feeds[0].bind) == ("radixkv", "sha256",
                                                                        False)


def test_kv_events_bind_is_told_from_kv_events_and_a_worker_takes_one(capsys):
    from radixkv.cli import build_parser
    from radixkv.commands.route import build
    a, b = "http://127.0.0.1:1", "http://127.0.0.1:2"
    args = build_parser().parse_args(
        ["route", "--worker-urls", a, b, "--router", "round-robin",
         "--kv-events", f"{a}=tcp://127.0.0.1:5", "--kv-events-bind",
         f"{b}=tcp://127.0.0.1:6,tcp://127.0.0.1:7"])
    events = build(args).state.gateway.routing.events
    assert events == {a: EventSource("tcp://127.0.0.1:5", None, False),
                      b: EventSource("tcp://127.0.0.1:6", "tcp://127.0.0.1:7", True)}
    assert main(["route", "--worker-urls", a, "--router", "round-robin", "--kv-events",
                 f"{a}=tcp://127.0.0.1:5", "--kv-events-bind", f"{a}=tcp://127.0.0.1:6"]) == 2
    assert f"worker {a} has KV events already" in capsys.readouterr().err
