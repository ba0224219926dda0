"""`radixkv serve --replicas 2` on a local Ray cluster when one replica's process is killed with
SIGKILL while it streams: its streams end with an error event (no hang), the request router
forgets the dead replica (its rank mapping, its pages, its requests in flight), the other
replica's stream completes, and Ray Serve's replacement takes the rank and serves."""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from radixkv.rayserve.ingress import HUB, ray_serve
from radixkv.rayserve.request_router import router_config
from tests.server._helpers import READ_S, Stream, metric, wait_for
from tests.server.test_ray_serve import CFG, OPTS, PREFIX


def listing(url: str) -> dict:
    return httpx.get(f"{url}/replicas", timeout=30).json()


def running(rep: dict) -> int:
    return int(metric(rep["url"], "vllm:num_requests_running"))


@pytest.mark.slow
def test_a_replica_killed_mid_stream_fails_its_streams_and_is_forgotten_and_replaced():
    config, events = router_config("radixkv-fit", 2, OPTS, CFG, HUB)
    with ray_serve(OPTS, CFG, 2, config, events=events) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/completions", json={"model": "llama-3-8b", "prompt": f"{PREFIX} warm",
                                            "max_tokens": 2})
        assert r.status_code == 200
        reps = {rep["rank"]: rep for rep in listing(url)["replicas"]}
        assert sorted(reps) == [0, 1]
        a = next(k for k, rep in reps.items()
                 if metric(rep["url"], "vllm:request_success_total") == 1)
        b = 1 - a
        dead = reps[a]["id"]
        on_a = [Stream(url, f"{PREFIX} s{i}", 4000).started() for i in range(3)]
        on_b = Stream(url, "Write a short poem about parcels and their long journeys.",
                      300).started()
        assert (running(reps[a]), running(reps[b])) == (3, 1)
        before = listing(url)["router"]
        assert before["ranks"][a]["replica"] == dead and before["ranks"][a]["pages"] > 0
        assert before["ranks"][a]["in_flight"] == 3 and before["dead"] == []
        # ---- SIGKILL replica A's process -------------------------------------------------------
        os.kill(reps[a]["pid"], signal.SIGKILL)
        killed = time.monotonic()
        for s in on_a:
            s.join(READ_S + 1)
            assert not s.is_alive()
        to_error = [round(s.ended - killed, 3) for s in on_a]
        for s in on_a:                        # an error event, then [DONE]: no transport error
            assert s.status == 200 and s.error is None, s.error
            assert s.lines[-1] == "data: [DONE]"
            err = json.loads(s.lines[-2][6:])["error"]
            assert err["code"] == 502 and "mid-stream" in err["message"], err
        assert max(to_error) < READ_S
        # ---- the router forgot A: no mapping, no pages, nothing in flight ----------------------
        to_forget = wait_for("the router forgets A",
                             lambda: listing(url)["router"]["dead"] == [dead], 15, every=0.1)
        after = listing(url)
        assert after["router"]["ranks"][a] == {"rank": a, "replica": None, "pages": 0,
                                               "in_flight": 0}
        assert after["router"]["ranks"][b]["replica"] == reps[b]["id"]
        assert dead not in [rep["id"] for rep in after["replicas"]]
        # ---- B's stream was never touched -------------------------------------------------------
        on_b.join(READ_S + 1)
        assert on_b.status == 200 and on_b.error is None and on_b.lines[-1] == "data: [DONE]"
        assert json.loads(on_b.lines[-2][6:])["usage"]["completion_tokens"] == 300
        # ---- Ray Serve's replacement takes rank A and serves -----------------------------------
        def replaced() -> bool:
            return any(rep["rank"] == a and rep["id"] != dead for rep in listing(url)["replicas"])
        to_replace = wait_for("a replacement takes rank A", replaced, 45, every=0.1)
        new = {rep["rank"]: rep for rep in listing(url)["replicas"]}
        served = [c.post("/v1/completions", json={"model": "llama-3-8b", "max_tokens": 2,
                                                  "prompt": f"question {i} about a parcel"})
                  for i in range(4)]
        assert [r.status_code for r in served] == [200] * 4
        ok = [metric(new[k]["url"], "vllm:request_success_total") for k in (a, b)]
        assert sum(ok) == 4 + 1                  # the 4, and B's stream before them
        state = listing(url)["router"]
        assert state["ranks"][a]["replica"] == new[a]["id"] and state["dead"] == [dead]
        print(f"time to the error event {to_error} s; router forgot A after {to_forget:.2f} s; "
              f"replacement listed after {to_replace:.2f} s; served by (replacement, B): {ok}")
