"""The server through the real openai client: completions and chat, streaming, cached tokens,
metrics moving by exact token counts, flush, server_info, and disconnects releasing slots."""
from __future__ import annotations

import json

import httpx
import pytest

from radixkv.config import CacheConfig
from tests.server._helpers import check_clean, client, metric, on_engine, running_server, wait_idle

SYSTEM = "You are a careful support agent. Answer in one short sentence. " * 4


@pytest.fixture(scope="module")
def tiny():
    with running_server(model="tiny-llama", executor="torch") as s:
        yield s


def test_chat_then_repeat_reports_cached_tokens(tiny):
    url, state = tiny
    c = client(url)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is my order?"}]
    first = c.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=6,
                                      temperature=0)
    second = c.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=6,
                                       temperature=0)
    n = state.template.encode([(m["role"], m["content"]) for m in msgs])
    assert first.usage.prompt_tokens == second.usage.prompt_tokens == len(n)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # the whole prompt but its last token (which is fed to produce the first output)
    assert second.usage.prompt_tokens_details.cached_tokens == len(n) - 1
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.content == first.choices[0].message.content   # greedy
    check_clean(state)


def test_streamed_completion_with_usage(tiny):
    url, state = tiny
    c = client(url)
    prompt = list(range(40, 90))
    chunks = list(c.completions.create(model="tiny-llama", prompt=prompt, max_tokens=5,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}, temperature=0))
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == 50 and usage.completion_tokens == 5
    assert [ch.choices[0].finish_reason for ch in chunks[:-1]][-1] == "length"
    whole = c.completions.create(model="tiny-llama", prompt=prompt, max_tokens=5, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == whole.choices[0].text
    assert whole.usage.prompt_tokens_details.cached_tokens == 49
    check_clean(state)


def test_metrics_move_by_exact_token_counts():
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        c = client(url)
        q0, h0 = metric(url, "vllm:prefix_cache_queries_total"), metric(url, "vllm:prefix_cache_hits_total")
        assert (q0, h0) == (0, 0)
        prompt = list(range(1000, 1300))
        for _ in range(2):
            c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=3)
        assert metric(url, "vllm:prefix_cache_queries_total") == 600
        assert metric(url, "vllm:prefix_cache_hits_total") == 299
        assert metric(url, "sglang:cache_hit_rate") == pytest.approx(299 / 600)
        assert metric(url, "vllm:generation_tokens_total") == 6
        assert metric(url, "vllm:request_success_total") == 2
        assert metric(url, "vllm:time_to_first_token_seconds_count") == 2
        assert metric(url, "vllm:num_requests_running") == 0
        assert metric(url, "vllm:num_requests_waiting") == 0
        # everything is cached and evictable: no slot is in use by a request
        assert metric(url, "vllm:kv_cache_usage_perc") == 0
        assert metric(url, "sglang:token_usage") == 0
        check_clean(state)


def test_flush_cache_empties_the_tree_and_server_info_says_why_cache_is_off():
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        client(url).completions.create(model="llama-3-8b", prompt=list(range(64)), max_tokens=2)
        assert on_engine(state, lambda e: e.cache.total_size()) > 0
        r = httpx.post(f"{url}/flush_cache")
        assert r.status_code == 200
        assert on_engine(state, lambda e: e.cache.total_size()) == 0
        info = httpx.get(f"{url}/server_info").json()
        assert info["cache_enabled"] is True and info["cache_disabled_reason"] is None
        assert info["live"]["kv_slots_used"] == 0
    with running_server(executor="sim", model="llama-3-8b", cache=CacheConfig(kind="none")) as (url, state):
        info = httpx.get(f"{url}/server_info").json()
        assert info["cache_enabled"] is False
        assert "no prefix is cached" in info["cache_disabled_reason"]
        r = client(url).completions.create(model="llama-3-8b", prompt=list(range(64)), max_tokens=2)
        r2 = client(url).completions.create(model="llama-3-8b", prompt=list(range(64)), max_tokens=2)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert r2.usage.prompt_tokens_details.cached_tokens == 0
        check_clean(state)


def test_disconnect_mid_stream_releases_lock_and_slots():
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        body = {"model": "llama-3-8b", "prompt": list(range(500)), "max_tokens": 4000,
                "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=30) as h:
            with h.stream("POST", f"{url}/v1/completions", json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                got = [next(lines) for _ in range(6)]          # a few tokens, then hang up
                assert any(g.startswith("data: ") for g in got)
                held = on_engine(state, lambda e: len(e.manager.holders()))
                assert held == 1
        wait_idle(state)
        s = check_clean(state)
        assert s["used"] == s["tree"] and s["protected"] == 0
        assert metric(url, "radixkv_aborted_requests_total") == 1
        assert metric(url, "vllm:request_success_total") == 0


def test_served_model_name_and_models_route():
    with running_server(executor="sim", model="llama-3-8b", served_model_name="my-llama") as (url, _):
        models = client(url).models.list()
        assert [m.id for m in models.data] == ["my-llama"]
        r = httpx.post(f"{url}/v1/completions", json={"model": "llama-3-8b", "prompt": "hi"})
        assert r.status_code == 404 and "my-llama" in r.json()["error"]["message"]
        ok = httpx.post(f"{url}/v1/completions", json={"model": "my-llama", "prompt": "hi",
                                                        "max_tokens": 2})
        assert ok.status_code == 200 and json.loads(ok.text)["usage"]["completion_tokens"] == 2


def test_regression_delivery_to_a_closed_loop_does_not_raise():
    """At shutdown the engine thread may deliver to an event loop that is already closed;
    call_soon_threadsafe then raises RuntimeError, which used to end the engine thread."""
    import asyncio

    from radixkv.server.updates import UpdateQueue
    from radixkv.server.worker import Update
    loop = asyncio.new_event_loop()
    q = UpdateQueue(None, None, loop)          # the worker and request: only for an overflow
    q.deliver(Update((1,)))
    assert loop.run_until_complete(q.get()) == Update((1,))
    loop.close()
    q.deliver(Update((2,), "abort"))          # dropped, no exception
    assert q.qsize() == 0


def test_sim_server_prices_steps_with_a_calibration_profile(tmp_path):
    """`serve --executor sim --profile P` runs the profiled model (its vocabulary, context
    and step prices) instead of a named GPU."""
    from radixkv.shapes import get_model_config
    from radixkv.sim.profile import Profile, Sample, fit
    from radixkv.sim.specs import ModelSpec
    margs = get_model_config("tiny-llama")
    spec = ModelSpec(margs, dtype_bytes=4)
    samples = [Sample(((p, n),), (), 1e-3 + 1e-5 * n) for n in (8, 64, 512) for p in (0, 300)]
    samples += [Sample((), (c,) * b, 2e-3 + 1e-5 * b) for b in (1, 8) for c in (50, 900)]
    coef, res = fit(spec, samples)
    path = tmp_path / "p.json"
    Profile(model=margs, dtype="float32", dtype_bytes=4, device="cpu", device_name="test",
            backend="sdpa", machine={"host": "test"}, grid={"repeats": 1}, coefficients=coef,
            residuals=res, samples=tuple(samples)).save(path)
    with running_server(executor="sim", model="tiny-llama", profile=str(path)) as (url, state):
        info = httpx.get(f"{url}/server_info").json()
        assert info["vocab_size"] == 259 and info["max_model_len"] == margs.max_seq_len
        assert "tiny-llama" in info["executor"]
        r = client(url).completions.create(model="tiny-llama", prompt="hello " * 20, max_tokens=3)
        assert r.usage.completion_tokens == 3
    with pytest.raises(ValueError, match="was measured on|tiny-llama"):
        running_server(executor="sim", model="llama-3-8b", profile=str(path)).__enter__()
    with pytest.raises(ValueError, match="simulated executor"):
        running_server(executor="torch", profile=str(path)).__enter__()


def test_regression_calls_after_the_engine_stopped_are_answered():
    """A call or request put in the inbox while (or after) the engine thread closed it used to
    wait forever; now it fails or ends at once."""
    from radixkv.sched.request import Request
    from radixkv.server.worker import Update
    with running_server(executor="sim", model="llama-3-8b") as (_, state):
        worker = state.worker
    assert not worker.alive()
    got: list[Update] = []
    worker._put(("add", Request("late", [1, 2, 3], 4), got.append))
    assert got == [Update((), "abort", (3, 0, 0))]
    fut = worker.call(lambda e: 1)
    with pytest.raises(RuntimeError):
        fut.result(timeout=5)
    from concurrent.futures import Future
    raw: Future = Future()
    worker._put(("call", lambda e: 1, raw))     # past the alive() check, as in the race
    with pytest.raises(RuntimeError, match="stopped"):
        raw.result(timeout=5)


def test_regression_host_tier_with_the_real_model_serves():
    """serve built the torch executor without a host buffer, so the first plan carrying
    host-tier copies ended the engine thread (every client got an error, /health 503)."""
    cache = CacheConfig("radix", 1, "lru", host_kv_tokens=256)
    with running_server(model="tiny-llama", executor="torch", kv_capacity=64,
                        cache=cache) as (url, state):
        c = client(url)
        a, b = list(range(10, 50)), list(range(60, 100))
        hits = [c.completions.create(model="tiny-llama", prompt=p, max_tokens=4,
                                     temperature=0).usage.prompt_tokens_details.cached_tokens
                for p in (a, b, a)]
        assert hits[:2] == [0, 0] and hits[2] == 39        # A came back from the host tier
        assert httpx.get(f"{url}/health").status_code == 200
        assert on_engine(state, lambda e: e.cache.stats()["host_loaded_tokens"]) > 0
        check_clean(state)


def test_a_chats_turn_is_the_replies_it_holds(tiny):
    # what the reuse eviction order learns from; a completion has no turn
    from starlette.requests import Request as HTTPRequest
    from radixkv.server.state import make_request as _make_request
    from radixkv.server.protocol import ChatCompletionRequest, CompletionRequest
    _, state = tiny
    raw = HTTPRequest({"type": "http", "headers": []})
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    chat = _make_request(state, raw, ChatCompletionRequest(messages=msgs, max_tokens=2), True)
    plain = _make_request(state, raw, CompletionRequest(prompt="hello", max_tokens=2), False)
    assert (chat.turn, plain.turn) == (2, None)
