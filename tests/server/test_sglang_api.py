"""SGLang's own endpoints: model and server info under SGLang's keys, /get_load and /v1/loads,
native /generate (text or input_ids, streamed or not, meta_info with cached tokens), the
`sglext.cached_tokens_details` of the OpenAI routes; and gauges fresh after an abort."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.server._helpers import check_clean, client, metric, on_engine, running_server, wait_idle

PROMPT = list(range(20, 120))


@pytest.fixture(scope="module")
def sim():
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=8192) as s:
        yield s


def test_model_and_server_info_under_sglangs_keys(sim):
    url, _ = sim
    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(f"{url}{path}").json()
        assert (info["model_path"], info["served_model_name"], info["is_generation"]) == \
            ("llama-3-8b", "llama-3-8b", True)
        assert info["architectures"] == ["LlamaForCausalLM"] and info["tokenizer_path"] is None
    for path in ("/get_server_info", "/server_info"):
        s = httpx.get(f"{url}{path}").json()
        assert (s["model_path"], s["served_model_name"], s["page_size"], s["max_total_num_tokens"],
                s["max_running_requests"], s["context_length"]) == \
            ("llama-3-8b", "llama-3-8b", 1, 8192, 256, 8192)
        assert s["tokenizer"] == {"kind": "bytes", "path": None, "vocab_size": 128256}
        assert s["vocab_size"] == 128256           # the model's, which its tokenizer covers
    internal = httpx.get(f"{url}/get_server_info").json()["internal_states"][0]
    assert (internal["num_running_reqs"], internal["num_waiting_reqs"]) == (0, 0)


def test_generate_text_and_input_ids_with_cached_tokens(sim):
    url, state = sim
    first = httpx.post(f"{url}/generate", json={
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}).json()
    again = httpx.post(f"{url}/generate", json={
        "input_ids": PROMPT, "return_cached_tokens_details": True,
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}}).json()
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert (first["meta_info"]["prompt_tokens"], first["meta_info"]["completion_tokens"],
            first["meta_info"]["cached_tokens"]) == (100, 4, 0)
    assert again["meta_info"]["cached_tokens"] == 99
    assert again["meta_info"]["cached_tokens_details"] == {"device": 99, "host": 0}
    assert "cached_tokens_details" not in first["meta_info"]
    assert len(first["output_ids"]) == 4 and first["text"] == state.tokenizer.decode(first["output_ids"])
    text = httpx.post(f"{url}/generate", json={"text": "hello", "sampling_params": {
        "max_new_tokens": 2}}).json()
    assert text["meta_info"]["prompt_tokens"] == 6            # <bos> + 5 bytes
    wait_idle(state)
    check_clean(state)


def test_generate_streams_the_text_so_far_then_done(sim):
    url, state = sim
    lines = []
    with httpx.stream("POST", f"{url}/generate", json={
            "text": "stream me", "stream": True,
            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))
    assert [c["meta_info"]["finish_reason"] for c in chunks][-2:] == \
        [None, {"type": "length", "length": 5}]
    wait_idle(state)
    check_clean(state)


@pytest.mark.parametrize("body, message", [
    ({"sampling_params": {"max_new_tokens": 2}}, "give exactly one of text and input_ids"),
    ({"text": "a", "input_ids": [1]}, "give exactly one of text and input_ids"),
    ({"input_ids": []}, "prompt"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
    ({"input_ids": [1, 2, 10**9]}, "prompt token id 1000000000 is outside the vocabulary"),
    ({"text": "a", "sampling_params": {"stop": ["x"]}}, "stop strings are not supported"),
])
def test_generate_refuses_bad_bodies(sim, body, message):
    url, state = sim
    r = httpx.post(f"{url}/generate", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert httpx.post(f"{url}/generate", content=b"{not json").status_code == 400
    check_clean(state)


def test_get_load_counts_what_is_running_and_waiting(sim):
    url, state = sim
    load = httpx.get(f"{url}/get_load").json()
    assert len(load) == 1 and load[0]["dp_rank"] == 0
    assert {k: load[0][k] for k in ("num_reqs", "num_waiting_reqs", "num_tokens",
                                    "num_pending_tokens")} == \
        {"num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "num_pending_tokens": 0}
    loads = httpx.get(f"{url}/v1/loads").json()
    assert loads["loads"][0]["num_reqs"] == 0 and loads["version"]
    with httpx.stream("POST", f"{url}/generate", json={
            "input_ids": PROMPT, "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}) as r:
        it = r.iter_lines()
        next(ln for ln in it if ln.startswith("data: {"))
        busy = httpx.get(f"{url}/get_load").json()[0]
        assert busy["num_reqs"] == 1 and busy["num_waiting_reqs"] == 0
        assert busy["num_tokens"] >= len(PROMPT)
    wait_idle(state)
    check_clean(state)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_routes_carry_sglext_cached_tokens_details(sim, stream):
    url, state = sim
    c = client(url)
    prompt = list(range(300, 380))
    c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=2)
    extra = {"return_cached_tokens_details": True}
    if stream:
        chunks = [ch.model_dump() for ch in c.completions.create(
            model="llama-3-8b", prompt=prompt, max_tokens=2, stream=True, extra_body=extra,
            stream_options={"include_usage": True})]
        with_ext = [ch["sglext"] for ch in chunks if ch.get("sglext")]
        assert with_ext == [{"cached_tokens_details": {"device": 79, "host": 0}}] * 2
    else:
        r = c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=2,
                                 extra_body=extra).model_dump()
        assert r["sglext"] == {"cached_tokens_details": {"device": 79, "host": 0}}
        plain = c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=2).model_dump()
        assert "sglext" not in plain or plain["sglext"] is None
    wait_idle(state)
    check_clean(state)


def test_gauges_are_fresh_within_a_second_of_an_abort():
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=8192) as (url, state):
        c = client(url)
        stream = c.completions.create(model="llama-3-8b", prompt=PROMPT, max_tokens=2000,
                                      stream=True, extra_body={"ignore_eos": True})
        got = 0
        for _ in stream:
            got += 1
            if got == 2:
                break
        assert metric(url, "vllm:num_requests_running") == 1
        stream.close()                                  # the client hangs up after two chunks
        deadline = time.monotonic() + 1.0
        while metric(url, "vllm:num_requests_running") != 0:
            assert time.monotonic() < deadline, "the running gauge is stale"
            time.sleep(0.02)
        live = httpx.get(f"{url}/server_info").json()["live"]
        assert live["running"] == 0
        usage = (live["kv_slots_used"] - live["kv_slots_evictable"]) / live["kv_capacity"]
        assert metric(url, "vllm:kv_cache_usage_perc") == usage == 0.0
        assert metric(url, "sglang:num_running_reqs") == 0
        assert on_engine(state, lambda e: e.has_work()) is False
        check_clean(state)
