"""Load and faults against the simulated GPU: many concurrent streaming clients, a tenth of
their requests hanging up mid-stream; afterwards nothing is running, every slot is back in the
pool or the tree, and conservation holds. The 60-second run is `slow` (`make load`); a short
one runs with the tests."""
from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import numpy as np
import pytest

from tests.server._helpers import check_clean, metric, running_server, wait_idle

PREFIXES = 8                 # shared system prompts
PREFIX_LEN, SUFFIX_LEN = 600, 40


async def _client(url: str, cid: int, until: float, out: dict, seed: int) -> None:
    rng = random.Random(seed * 1000 + cid)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as h:
        while time.monotonic() < until:
            p = rng.randrange(PREFIXES)
            prompt = [p * 1000 + i for i in range(PREFIX_LEN)] + \
                     [rng.randrange(100_000) for _ in range(SUFFIX_LEN)]
            body = {"model": "llama-3-8b", "prompt": prompt, "max_tokens": rng.randint(16, 96),
                    "stream": True, "ignore_eos": True}
            hang_up = rng.random() < 0.1
            t0, first = time.monotonic(), None
            try:
                async with h.stream("POST", f"{url}/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        out["errors"].append(f"HTTP {r.status_code}")
                        continue
                    chunks = 0
                    async for line in r.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        if first is None:
                            first = time.monotonic() - t0
                        if line == "data: [DONE]":
                            break
                        chunks += 1
                        if hang_up and chunks >= 3:
                            break                     # leaves the stream: the server aborts
                if hang_up and chunks >= 3:
                    out["disconnected"] += 1
                else:
                    out["completed"] += 1
                    out["ttft"].append(first)
            except (httpx.HTTPError, asyncio.TimeoutError) as e:
                out["errors"].append(f"{type(e).__name__}: {e}")


def load_run(num_clients: int, seconds: float, seed: int = 0) -> dict:
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=60_000,
                        check_invariants=False) as (url, state):
        out = {"completed": 0, "disconnected": 0, "errors": [], "ttft": []}

        async def main():
            until = time.monotonic() + seconds
            await asyncio.gather(*(_client(url, c, until, out, seed) for c in range(num_clients)))
        t0 = time.monotonic()
        asyncio.run(main())
        wall = time.monotonic() - t0
        wait_idle(state, timeout=60)
        s = check_clean(state)
        used, tree = s["used"], s["tree"]
        res = {"clients": num_clients, "seconds": round(wall, 1), "completed": out["completed"],
               "disconnected": out["disconnected"], "errors": len(out["errors"]),
               "error_examples": out["errors"][:3],
               "ttft_p50_s": float(np.percentile(out["ttft"], 50)) if out["ttft"] else None,
               "ttft_p99_s": float(np.percentile(out["ttft"], 99)) if out["ttft"] else None,
               "aborted_on_server": metric(url, "radixkv_aborted_requests_total"),
               "finished_on_server": metric(url, "vllm:request_success_total"),
               "hit_rate": metric(url, "sglang:cache_hit_rate"),
               "running_after": metric(url, "vllm:num_requests_running"),
               "slots_leaked": used - tree}
        print("load:", json.dumps(res))
        return res


def _check(res: dict) -> None:
    assert res["errors"] == 0, res["error_examples"]
    assert res["completed"] > 0 and res["disconnected"] > 0
    assert res["running_after"] == 0 and res["slots_leaked"] == 0
    # every request the server saw either finished or was aborted when its client left (a
    # request can finish in the instant its client hangs up: then it counts as finished)
    assert res["finished_on_server"] + res["aborted_on_server"] == res["completed"] + res["disconnected"]
    assert res["aborted_on_server"] <= res["disconnected"]


def test_load_short():
    _check(load_run(num_clients=40, seconds=4))


@pytest.mark.slow
def test_load_200_clients_60_seconds():
    _check(load_run(num_clients=200, seconds=60))
