"""The peers' routers in front of two radixkv replicas: a burst of requests sharing a long prefix
all lands on the replica that holds the prefix (each worker's own request counter says where
each went), every request after the first finds the prefix cached, and the router's /v1/models
names the model its workers serve. vllm-router routes `cache_aware` on the token ids it asks
the workers for (/tokenize, render) and `kv_aware` on their KV events (vLLM's current encoding);
sglang-router `cache_aware` on text, naming the model from /server_info and /model_info."""
from __future__ import annotations

import httpx
import pytest

from tests.interop.conftest import MODEL, counter, free_port, running, tool, workers

pytestmark = pytest.mark.interop

PREFIX = "You are the support agent of a parcel company. Answer in one short sentence. " * 12
BURST = 30


def burst(router: str) -> list[int]:
    """BURST completions sharing PREFIX, one after another; the cached tokens of each."""
    cached = []
    with httpx.Client(base_url=router, timeout=60) as c:
        for i in range(BURST):
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": f"{PREFIX}Question {i}?",
                                                "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    return cached


def landed(fleet) -> list[int]:
    return [int(counter(w.url, "vllm:request_success_total")) for w in fleet]


def check_burst(router: str, fleet) -> None:
    cached = burst(router)
    assert sorted(landed(fleet)) == [0, BURST]            # every request on one replica
    prefix_len = len(PREFIX.encode()) + 1                  # <bos> and the prefix's bytes
    assert cached[0] == 0 and min(cached[1:]) >= prefix_len
    models = httpx.get(f"{router}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


@pytest.mark.parametrize("policy", ["cache_aware", "kv_aware"])
def test_vllm_router(policy, tmp_path):
    exe = tool("vllm-router")
    with workers(2, events=policy == "kv_aware") as fleet:
        port = free_port()
        cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
               "--prometheus-port", str(free_port()), "--worker-urls", *[w.url for w in fleet]]
        if policy == "kv_aware":
            for w in fleet:
                cmd += ["--kv-event-source", f"{w.url}={w.events}"]
            cmd += ["--kv-event-block-size", "1", "--kv-event-model", MODEL]
        router = f"http://127.0.0.1:{port}"
        with running(cmd, f"{router}/health", tmp_path / "router.log"):
            check_burst(router, fleet)


def test_sglang_router_cache_aware(tmp_path):
    exe = tool("sglang-router")
    with workers(2) as fleet:
        port = free_port()
        router = f"http://127.0.0.1:{port}"
        cmd = [exe, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy",
               "cache_aware", "--prometheus-port", str(free_port()),
               "--worker-urls", *[w.url for w in fleet]]
        with running(cmd, f"{router}/health", tmp_path / "router.log"):
            check_burst(router, fleet)
