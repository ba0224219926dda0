"""The gateway's endpoints, fuzzed, in front of one sim worker on 127.0.0.1: /v1/completions and
/v1/chat/completions take 500 near-valid bodies each (tests/server/_fuzz.py) and answer below
500, a 4xx with the OpenAI error body, the worker idle and clean after every 100; POST /workers
and DELETE /workers/{url} take 500 generated bodies and URLs each and answer 4xx, the fleet
(GET /workers) exactly as before."""
from __future__ import annotations

import contextlib
from urllib.parse import quote

import httpx
import pytest
from hypothesis import assume, given, strategies as st

from radixkv.gateway.core import Routing
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.tokens import Tokens
from radixkv.server.launch import ServerThread
from tests.server import _fuzz as F
from tests.server._helpers import check_clean, running_server, wait_idle

BATCH = 100
CLOSED = ("http://127.0.0.1:1", "http://127.0.0.1:9")          # nothing listens there


@pytest.fixture(scope="module")
def fleet():
    with contextlib.ExitStack() as stack:
        wurl, wstate = stack.enter_context(running_server(executor="sim", model=F.MODEL))
        gw = Gateway([wurl], Routing("round-robin"), Tokens(None), health_interval=600,
                     scrape_interval=600)
        url = stack.enter_context(ServerThread(build_gateway_app(gw)))
        c = stack.enter_context(httpx.Client(base_url=url, timeout=60))
        yield wurl, wstate, gw, c


def test_the_fuzzed_routes_are_all_the_gateways_routes(fleet):
    _, _, gw, _ = fleet
    app = build_gateway_app(gw)
    got = sorted((m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ())
                 if m != "HEAD" and r.path not in ("/openapi.json", "/docs", "/redoc",
                                                   "/docs/oauth2-redirect"))
    assert got == [("DELETE", "/workers/{url:path}"), ("GET", "/health"), ("GET", "/metrics"),
                   ("GET", "/v1/models"), ("GET", "/workers"), ("POST", "/v1/chat/completions"),
                   ("POST", "/v1/completions"), ("POST", "/workers")]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fuzz_generation(fleet, path):
    _, wstate, gw, c = fleet
    bodies = F.completion_bodies if path == "/v1/completions" else F.chat_bodies
    statuses: dict[int, int] = {}

    @F.FUZZ
    @given(case=F.cases(bodies))
    def one(case):
        r = F.post(c, path, case)
        F.check_answer(r, case)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if sum(statuses.values()) % BATCH == 0:
            wait_idle(wstate)
            check_clean(wstate)
            assert not gw.relays and not gw.routing.inflight.infos

    one()
    assert sum(statuses.values()) >= 500
    assert statuses.get(200, 0) > 0 and any(400 <= s < 500 for s in statuses), statuses
    wait_idle(wstate)
    check_clean(wstate)


_urls = st.one_of(
    st.sampled_from(CLOSED), st.text(max_size=16),
    st.sampled_from(["", "http://", "https://", "http:///x", "http://:80", "http://[::1",
                     "http://a b", "http://%zz", "ftp://127.0.0.1:1", "127.0.0.1:8000",
                     "http://127.0.0.1:99999", "http://127.0.0.1:-1", "http://\ud800",
                     "http://127.0.0.1:1/" + "a" * 300, "HTTP://127.0.0.1:1", "http://1.2.3"]),
    st.builds(lambda s: "tcp://" + s, st.text(max_size=8)))
_events = st.one_of(st.sampled_from(["tcp://127.0.0.1:1", "tcp://127.0.0.1:1,tcp://127.0.0.1:2",
                                     "udp://x", "tcp://a,tcp://b,tcp://c", ",", "ipc://"]),
                    st.text(max_size=12))
worker_bodies = F.near({"url": _urls, "kv_events": _events})


def test_fuzz_add_worker_refuses_and_changes_nothing(fleet):
    wurl, _, gw, c = fleet
    before = c.get("/workers").json()
    n = [0]

    @F.FUZZ
    @given(case=F.cases(worker_bodies))
    def one(case):
        r = F.post(c, "/workers", case)
        assert 400 <= r.status_code < 500, (r.status_code, case, r.text[:300])
        F.check_answer(r, case)
        assert c.get("/workers").json() == before
        n[0] += 1

    one()
    assert n[0] >= 500
    assert [w.url for w in gw.routing.workers] == [wurl]
    assert c.post("/workers", json={"url": wurl}).status_code == 400     # in the fleet already
    assert c.get("/workers").json() == before


def test_fuzz_remove_worker_refuses_and_changes_nothing(fleet):
    wurl, _, gw, c = fleet
    before = c.get("/workers").json()
    n = [0]

    @F.FUZZ
    @given(url=st.one_of(_urls, st.text(max_size=40), st.just(wurl + "x"),
                         st.just(wurl.replace("127.0.0.1", "localhost"))))
    def one(url):
        assume(url.rstrip("/") != wurl)
        r = c.delete("/workers/" + quote(url.encode("utf-8", "surrogatepass"), safe="/:"))
        assert 400 <= r.status_code < 500, (r.status_code, url, r.text[:300])
        F.check_answer(r, url)
        assert c.get("/workers").json() == before
        n[0] += 1

    one()
    assert n[0] >= 500
    assert [w.url for w in gw.routing.workers] == [wurl]


def test_regression_bodies_the_gateway_failed_on_are_4xx_and_change_nothing(fleet):
    """Each of these was a 500 (or a 502, or a body not OpenAI's): the gateway re-encoded the
    body with httpx's json= (NaN and lone surrogates fail there), took `true` for max_tokens,
    hashed token ids no hash can take, let an unreachable or malformed worker URL through as a
    502 or an exception, and answered an unknown route with Starlette's {"detail"}. Now each
    answer is the worker's own (a 400, or a 200 for `true`, which pydantic reads as 1)."""
    wurl, wstate, gw, c = fleet
    before = c.get("/workers").json()
    for body in (b'{"prompt": "a", "max_tokens": 1, "temperature": NaN}',
                 b'{"prompt": "\\ud800", "max_tokens": 1}',
                 b'{"prompt": [1, 2], "max_tokens": true}',
                 b'{"prompt": [18446744073709551617], "max_tokens": 1}',
                 b'{"prompt": [-1, 5], "max_tokens": 1}'):
        h = {"content-type": "application/json"}
        r = c.post("/v1/completions", content=body, headers=h)
        direct = httpx.post(f"{wurl}/v1/completions", content=body, headers=h)
        assert r.status_code == direct.status_code < 500, (body, r.text, direct.text)
        F.check_answer(r, body)
    for url in ("http://127.0.0.1:1", "http://[::1", "http:///x"):
        r = c.post("/workers", json={"url": url})
        assert r.status_code == 400 and "does not answer as one" in r.json()["error"]["message"]
    for r in (c.get("/nope"), c.delete("/workers/%0A0"), c.put("/workers")):
        assert r.status_code in (404, 405)
        F.check_answer(r, r.url)
    assert c.get("/workers").json() == before
    wait_idle(wstate)
    check_clean(wstate)
