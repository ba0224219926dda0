"""`radixkv serve --replicas 2` on a local Ray cluster: two simulated replicas behind Ray Serve,
routed by a radixkv router inside a Ray Serve RequestRouter. A long prefix sent again and
again lands on the replica that holds it (radixkv); round-robin, the control, computes it on
both. Ray is shut down however each test ends."""
from __future__ import annotations

import httpx
import pytest

from radixkv.config import CacheConfig, EngineConfig
from radixkv.rayserve.request_router import router_config
from radixkv.server.build import ServeOptions
from radixkv.rayserve.ingress import HUB, check_options, ray_serve
from tests.server._helpers import client

OPTS = ServeOptions(model="llama-3-8b", executor="sim", enable_metrics=True)
CFG = EngineConfig(kv_capacity=50_000, cache=CacheConfig(page_size=16))
PREFIX = "You are the support agent of a large company; answer briefly and politely. " * 30
REPEATS = 5
# a local Ray cluster a test (about ten seconds each): `make test-slow`
pytestmark = pytest.mark.long


def hits_per_replica(url: str) -> list[tuple[float, float]]:
    """(prefix-cache hits, queries) of each replica, in rank order, from its own /metrics."""
    out = []
    for rep in httpx.get(f"{url}/replicas", timeout=30).json()["replicas"]:
        text = httpx.get(f"{rep['url']}/metrics", timeout=30).text
        series = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                  for line in text.splitlines() if line.startswith("vllm:prefix_cache_")}
        out.append((series["vllm:prefix_cache_hits_total"],
                    series["vllm:prefix_cache_queries_total"]))
    return out


def run_prefix(router: str) -> tuple[list[int], list[tuple[float, float]]]:
    """Cached tokens of 1 + REPEATS requests sharing PREFIX, then each replica's hits."""
    config, events = router_config(router, 2, OPTS, CFG, HUB)
    with ray_serve(OPTS, CFG, 2, config, events=events) as url:
        api = client(url)
        cached = []
        for i in range(1 + REPEATS):
            r = api.completions.create(model="llama-3-8b", prompt=f"{PREFIX}question {i}?",
                                       max_tokens=4)
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
        stream = api.chat.completions.create(
            model="llama-3-8b", messages=[{"role": "user", "content": "hello"}], max_tokens=5,
            stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert chunks[-1].usage.completion_tokens == 5
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return cached, hits_per_replica(url)


def test_radixkv_router_keeps_a_prefix_on_the_replica_that_holds_it():
    cached, hits = run_prefix("radixkv")
    print("radixkv: cached tokens per request", cached, "(hits, queries) per replica", hits)
    prefix_tokens = cached[1]
    assert cached[0] == 0 and prefix_tokens > len(PREFIX) - 16
    assert cached[1:] == [prefix_tokens] * REPEATS          # every repeat hit its prefix
    holder = max(range(2), key=lambda i: hits[i][0])
    assert hits[holder][0] == REPEATS * prefix_tokens     # ...on one replica
    assert hits[1 - holder][0] == 0


def test_round_robin_control_computes_the_prefix_on_both_replicas():
    cached, hits = run_prefix("round-robin")
    print("round-robin: cached tokens per request", cached, "(hits, queries) per replica", hits)
    assert cached[:2] == [0, 0]                              # the second went to the other one
    assert all(h > 0 for h, _ in hits)


@pytest.mark.parametrize("bad, message", [
    (dict(router="nope"), "--router 'nope' is unknown"),
    (dict(replicas=0), "--replicas must be"),
    (dict(opts=ServeOptions(device="cuda")), "--device cuda is not supported with --replicas"),
])
def test_bad_settings_are_refused_by_name(bad, message):
    opts = bad.get("opts", OPTS)
    with pytest.raises(ValueError, match=message):
        check_options(opts, bad.get("replicas", 2))
        router_config(bad.get("router", "radixkv"), 2, opts, CFG, HUB)


def test_regression_a_free_port_taken_before_the_proxy_binds_it_is_chosen_again(monkeypatch):
    """The proxy's port is free when chosen and bound later by its actor: a process that binds
    it first made serve.start fail ("Failed to bind"). A chosen port is now chosen again; a
    port the caller named still fails, naming it."""
    import ray
    from ray import serve
    from ray.exceptions import RayError

    from radixkv.rayserve import ingress
    from radixkv.server.launch import bind

    taken = bind("127.0.0.1", 0)
    busy = taken.getsockname()[1]
    offered = iter([busy])
    real = ingress.free_port
    monkeypatch.setattr(ingress, "free_port", lambda host: next(offered, None) or real(host))
    ingress.init_ray()
    try:
        with pytest.raises(RayError, match=f"Failed to bind to address '127.0.0.1:{busy}'"):
            ingress.start_proxy("127.0.0.1", busy)
        serve.shutdown()
        port = ingress.start_proxy("127.0.0.1", 0)
        assert port != busy and next(offered, None) is None     # the busy one was offered
        r = httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=30)   # Serve's proxy,
        assert (r.status_code, r.text) == (503, "Route table is not populated yet.")  # no app
    finally:
        taken.close()
        serve.shutdown()
        ray.shutdown()
