"""`radixkv route` in front of two real vLLM CPU workers (one core each, 8,192-token pools that
evict), fed by their KV events: the gateway looks prompts up by vLLM's block hashes, so its view
of each worker is the blocks an independent subscriber sees the worker hold, its predicted
cached tokens are the ones vLLM reports, and no worker is named as a hash mismatch."""
from __future__ import annotations

import random
import time

import httpx
import pytest

from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.tokens import Tokens
from radixkv.server.launch import ServerThread
from radixkv.sim.costmodel import CostModel
from tests.realengine.events import AllBlocksCleared, BlockRemoved, BlockStored, Subscriber
from tests.realengine.workers import MODEL, SERVED_NAME, TOPIC, VllmWorkers

VOCAB = 8000
PREAMBLES, PREAMBLE_LEN, QUESTION_LEN = 4, 320, 40      # ten blocks a preamble
FILLERS, FILLER_LEN = 30, 900                           # fresh prompts: 27k tokens, evicting


def held(sub: Subscriber) -> set[int]:
    """The blocks a worker holds by its events as the independent subscriber decoded them."""
    out: set[int] = set()
    for e in sub.events_after(-1):
        if isinstance(e, BlockStored):
            out.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            out.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            out.clear()
    return out


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def workload(rng: random.Random) -> list[list[int]]:
    """Questions after shared preambles, interleaved with fresh fillers that fill both pools."""
    pre = [[rng.randrange(10, VOCAB) for _ in range(PREAMBLE_LEN)] for _ in range(PREAMBLES)]
    asks = [pre[k % PREAMBLES] + [rng.randrange(10, VOCAB) for _ in range(QUESTION_LEN)]
            for k in range(4 * PREAMBLES)]
    fills = [[rng.randrange(10, VOCAB) for _ in range(FILLER_LEN)] for _ in range(FILLERS)]
    out: list[list[int]] = []
    while asks or fills:
        out += [asks.pop(0)] if asks else []
        out += [fills.pop(0) for _ in range(2) if fills]
    return out


@pytest.fixture(scope="module")
def two_workers(real_engine, tmp_path_factory):
    with VllmWorkers(2, kv_tokens=8192, log_dir=tmp_path_factory.mktemp("vllm")) as ws:
        subs = [Subscriber(w.events, TOPIC) for w in ws]
        try:
            yield ws, subs
        finally:
            for s in subs:
                s.close()


def test_the_gateway_sees_what_vllm_holds_and_predicts_what_it_reports(two_workers):
    ws, subs = two_workers
    hits0 = [metric(w.url, "vllm:prefix_cache_hits_total") for w in ws]
    routing = Routing("radixkv-fit", cost=CostModel.named("llama-3-8b", "h100-sxm"),
                      events={w.url: EventSource(w.events, w.replay) for w in ws})
    gw = Gateway([w.url for w in ws], routing, Tokens(None))
    reported = predicted = 0
    with ServerThread(build_gateway_app(gw)) as url, httpx.Client(base_url=url,
                                                                  timeout=120) as c:
        assert routing.hash_algo == "vllm-sha256"          # from the workers' cache_config_info
        for ids in workload(random.Random(5)):
            before = metric(url, "radixkv_route_predicted_cached_tokens_total")
            r = c.post("/v1/completions", json={"model": SERVED_NAME, "prompt": ids,
                                                "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            reported += r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            predicted += metric(url, "radixkv_route_predicted_cached_tokens_total") - before
            time.sleep(0.3)                                 # the step's events reach the gateway
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                routing.indexes[i].hashes() != held(s) for i, s in enumerate(subs)):
            time.sleep(0.2)
        for i, s in enumerate(subs):
            assert routing.indexes[i].hashes() == held(s), f"worker {i}"
        evicted = sum(isinstance(e, BlockRemoved) for s in subs for e in s.events_after(-1))
        assert evicted > 0                                  # the pools evicted
        hits = sum(metric(w.url, "vllm:prefix_cache_hits_total") - h for w, h in zip(ws, hits0))
        print(f"cached tokens: vLLM reported {reported:,}, the gateway predicted "
              f"{predicted:,.0f}; {evicted:,} blocks evicted; per worker "
              f"{[len(held(s)) for s in subs]} blocks held")
        assert reported == hits == metric(url, "radixkv_route_reported_cached_tokens_total")
        assert reported >= 0.5 * 4 * PREAMBLES * (PREAMBLE_LEN // 32 * 32)
        assert abs(predicted - reported) <= 0.05 * reported, (predicted, reported)
        assert metric(url, "radixkv_route_kv_events_hash_mismatch") == 0
        assert metric(url, "radixkv_route_kv_events_prompts_found_total") > 0


CHATS = [[{"role": "user", "content": "Hello world, the prefix cache block."}],
         [{"role": "system", "content": "Answer briefly."},
          {"role": "user", "content": "What is a radix tree? Say it in one line, please."}]]
TEXTS = ["Hello world, the prefix cache block.", "a " * 300 + "question 12345?"]


def test_the_gateways_own_tokenizer_gives_the_ids_vllm_runs(two_workers):
    ws, _ = two_workers
    tokens = Tokens(str(MODEL))
    assert tokens.template.name == "checkpoint"          # chat_template.jinja, as vLLM reads it
    for msgs in CHATS:
        want = httpx.post(f"{ws[0].url}/tokenize",
                          json={"model": SERVED_NAME, "messages": msgs}).json()["tokens"]
        got = tokens.template.encode([(m["role"], m["content"]) for m in msgs])
        assert got == want
    for text in TEXTS:
        want = httpx.post(f"{ws[0].url}/tokenize",
                          json={"model": SERVED_NAME, "prompt": text}).json()["tokens"]
        assert tokens.tok.encode(text, add_bos=True) == want


def test_a_gateway_started_late_replays_what_it_missed(two_workers):
    # the event stream cut at the start: everything published before the gateway subscribed
    # comes back through each worker's replay socket
    ws, subs = two_workers
    with httpx.Client(timeout=120) as c:
        for k, w in enumerate(ws):                          # traffic nobody routes
            for i in range(3):
                r = c.post(f"{w.url}/v1/completions",
                           json={"model": SERVED_NAME, "max_tokens": 1,
                                 "prompt": [100 + k, 200 + i] + list(range(300, 400))})
                assert r.status_code == 200, r.text
    routing = Routing("llm-d-precise", events={w.url: EventSource(w.events, w.replay) for w in ws})
    gw = Gateway([w.url for w in ws], routing, Tokens(None))
    with ServerThread(build_gateway_app(gw)) as url:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                all(c.caught_up for c in routing.feed_counts().values())
                and all(routing.indexes[i].hashes() == held(s) for i, s in enumerate(subs))):
            time.sleep(0.2)
        counts = routing.feed_counts()
        assert all(c.caught_up and c.missed == 0 for c in counts.values()), counts
        for i, s in enumerate(subs):
            assert routing.indexes[i].hashes() == held(s), f"worker {i}"
        assert sum(c.replayed for c in counts.values()) > 0
        assert metric(url, "radixkv_route_kv_events_replayed_total") > 0
