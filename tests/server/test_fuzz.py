"""Every endpoint of one sim server, fuzzed: each POST route (enumerated from the app, so none is
missed) takes 500 near-valid bodies (tests/server/_fuzz.py) and answers each below 500, a 4xx
with the OpenAI error body; after every 100 the engine is idle, its invariants hold and no
request holds a slot or a lock. The GET routes answer, wrong methods are 405 with the error body."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given

from radixkv.config import EngineConfig
from radixkv.server.app import build_app
from radixkv.server.build import ServeOptions, build_server
from radixkv.server.launch import ServerThread
from tests.server import _fuzz as F
from tests.server._helpers import check_clean, wait_idle

# the routes fuzzed with each kind of body; a render answers exactly as its generation route
GROUPS = {"completions": (F.completion_bodies, ("/v1/completions", "/v1/completions/render")),
          "chat": (F.chat_bodies, ("/v1/chat/completions", "/v1/chat/completions/render")),
          "generate": (F.generate_bodies, ("/generate",)),
          "tokenize": (F.tokenize_bodies, ("/tokenize",)),
          "detokenize": (F.detokenize_bodies, ("/detokenize",)),
          "reset": (F.any_bodies, ("/flush_cache", "/reset_prefix_cache"))}
IGNORE_BODY = {"/flush_cache", "/reset_prefix_cache"}
BATCH = 100


@pytest.fixture(scope="module")
def server():
    state = build_server(ServeOptions(executor="sim", model=F.MODEL, enable_metrics=True),
                         EngineConfig(kv_capacity=20_000, check_invariants=True))
    app = build_app(state)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield app, state, c


def routes(app, method: str) -> list[str]:
    return sorted(r.path for r in app.routes if method in (getattr(r, "methods", None) or ()))


def settle(state) -> None:
    wait_idle(state)
    check_clean(state)


def test_every_post_route_has_a_fuzzer(server):
    app, _, _ = server
    assert routes(app, "POST") == sorted(p for _, paths in GROUPS.values() for p in paths)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_fuzz_post(server, group):
    _, state, c = server
    bodies, paths = GROUPS[group]
    statuses: dict[str, dict[int, int]] = {p: {} for p in paths}
    n = [0]

    @F.FUZZ
    @given(case=F.cases(bodies))
    def one(case):
        got = []
        for path in paths:
            r = F.post(c, path, case)
            F.check_answer(r, case)
            statuses[path][r.status_code] = statuses[path].get(r.status_code, 0) + 1
            got.append(r.status_code)
        assert len(set(got)) == 1, (got, case)          # a render checks as its route does
        n[0] += 1
        if n[0] % BATCH == 0:
            settle(state)

    one()
    assert n[0] >= 500
    for path in paths:
        if path in IGNORE_BODY:             # nothing runs: each is a reset, whatever the body
            assert statuses[path] == {200: n[0]}, statuses
        else:
            assert statuses[path].get(200, 0) > 0, statuses
            assert sum(v for s, v in statuses[path].items() if 400 <= s < 500) > 0, statuses
    settle(state)


def test_get_routes_answer_and_wrong_methods_are_405(server):
    app, state, c = server
    for path in routes(app, "GET"):
        for query in ("", "?x=1", "?%ff=%00&" + "a" * 200):
            r = c.get(path + query)
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
    for path in routes(app, "POST"):
        r = c.get(path)
        assert r.status_code == 405
        F.check_answer(r, path)
    for path in ("/nope", "/v1/nope", "/v1/completions/x/y"):
        r = c.post(path, json={})
        assert r.status_code == 404
        F.check_answer(r, path)
    settle(state)


def test_regression_generate_answers_a_body_that_is_not_utf8_with_400(server):
    """/generate read its body with `raw.json()`, whose UnicodeDecodeError was not caught: a
    body of invalid UTF-8 was a 500."""
    _, state, c = server
    for content in (b"\x80", b'{"text": "\xc3\x28"}', b"\xff\xfe{}"):
        r = c.post("/generate", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        F.check_answer(r, content)
    settle(state)


def test_regression_a_lone_surrogate_in_text_is_400(server):
    """JSON's "\\ud800" decodes to a str no tokenizer can encode: the prompt of /v1/completions,
    its render, /tokenize and /generate reached the tokenizer and were a 500."""
    _, state, c = server
    for path, body in (("/v1/completions", {"prompt": "a\ud800", "max_tokens": 1}),
                       ("/v1/completions/render", {"prompt": "\ud800", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "\udfff"}]}),
                       ("/tokenize", {"prompt": "\ud800"}),
                       ("/generate", {"text": "\ud800", "sampling_params": {"max_new_tokens": 1}})):
        content = json.dumps(body).encode()
        r = c.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        assert "lone surrogate" in r.json()["error"]["message"]
        F.check_answer(r, content)
    settle(state)
