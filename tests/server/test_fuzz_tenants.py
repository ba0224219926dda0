"""The endpoints beside the OpenAI API under tenants, on one sim server with API keys: /tokenize,
/detokenize, /generate and both renders need a key (401 without, or with any other header,
fuzzed), /generate reads only the caller's namespace (cached tokens), the renders name no
other tenant's salt, and both cache resets need the operator's key (403 otherwise)."""
from __future__ import annotations

import httpx
import pytest
from hypothesis import given, strategies as st

from radixkv.server.tenants import Tenants
from tests.server import _fuzz as F
from tests.server._helpers import check_clean, running_server, wait_idle

KEYS = {"keys": {"sk-alpha": "alpha", "sk-beta": "beta"}, "shared_namespace": "common",
        "admin_keys": ["sk-operator"]}
ALPHA, BETA, OPERATOR = ({"authorization": f"Bearer {k}"} for k in ("sk-alpha", "sk-beta",
                                                                    "sk-operator"))
BODIES = {"/tokenize": {"prompt": "hello"}, "/detokenize": {"tokens": [104, 105]},
          "/generate": {"input_ids": list(range(300, 340)),
                        "sampling_params": {"max_new_tokens": 2}},
          "/v1/completions/render": {"prompt": [1, 2, 3], "max_tokens": 2},
          "/v1/chat/completions/render": {"messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 2},
          "/v1/completions": {"prompt": [1, 2, 3], "max_tokens": 1},
          "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 1}}
RESETS = ("/flush_cache", "/reset_prefix_cache")


@pytest.fixture(scope="module")
def server():
    with running_server(executor="sim", model=F.MODEL, tenants=Tenants.from_obj(KEYS)) as (url, s):
        with httpx.Client(base_url=url, timeout=60) as c:
            yield s, c


def settle(state) -> None:
    wait_idle(state)
    check_clean(state)


def cached(c: httpx.Client, headers: dict, ids: list[int]) -> int:
    r = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}},
               headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]["cached_tokens"]


def test_every_endpoint_needs_a_key(server):
    state, c = server
    for path, body in BODIES.items():
        for headers in ({}, {"authorization": "Bearer sk-nope"}, {"authorization": "sk-alpha"},
                        {"authorization": "Basic sk-alpha"}, {"authorization": "Bearer"},
                        {"authorization": "Bearer sk-operator"}):
            r = c.post(path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            F.check_answer(r, body)
            assert r.json()["error"]["type"] == "authentication_error"
        for headers in (ALPHA, BETA):
            assert c.post(path, json=body, headers=headers).status_code == 200, path
    for path in ("/v1/models", "/model_info", "/get_model_info"):
        assert c.get(path).status_code == 401 and c.get(path, headers=ALPHA).status_code == 200
    settle(state)


@F.FUZZ
@given(key=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=24)
       | st.sampled_from(["sk-alpha", "sk-beta", "sk-operator", "sk-alpha\tx", "sk-alph"]),
       scheme=st.sampled_from(["Bearer ", "bearer ", "", "Token ", "Bearer  "]),
       path=st.sampled_from(sorted(BODIES)))
def test_fuzzed_keys_are_401_unless_a_tenants(server, key, scheme, path):
    _, c = server
    r = c.post(path, json=BODIES[path], headers={"authorization": (scheme + key).strip()})
    known = scheme.lower().startswith("bearer") and key in ("sk-alpha", "sk-beta")
    assert r.status_code == (200 if known else 401), (scheme, key, r.text)
    F.check_answer(r, key)


def test_generate_reads_only_the_callers_namespace(server):
    state, c = server
    ids = list(range(1000, 1200))
    assert cached(c, ALPHA, ids) == 0
    assert cached(c, ALPHA, ids) == 199            # alpha's own prefix
    assert cached(c, BETA, ids) == 0               # identical tokens, another tenant: a miss
    assert cached(c, BETA, ids) == 199
    r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 1}, headers=ALPHA)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 199
    # a render runs nothing and names no salt it was not given
    for headers in (ALPHA, BETA):
        r = c.post("/v1/completions/render", json={"prompt": ids, "max_tokens": 1},
                   headers=headers)
        assert r.status_code == 200 and r.json()[0]["cache_salt"] is None
        assert r.json()[0]["token_ids"] == ids
    settle(state)


def test_cache_resets_need_the_operators_key(server):
    state, c = server
    ids = list(range(3000, 3100))
    for path in RESETS:
        cached(c, ALPHA, ids)
        assert cached(c, ALPHA, ids) == 99
        for headers in ({}, ALPHA, BETA, {"authorization": "Bearer sk-nope"}):
            r = c.post(path, headers=headers)
            assert r.status_code == 403, (path, headers, r.text)
            F.check_answer(r, path)
            assert r.json()["error"]["type"] == "permission_error"
        assert cached(c, ALPHA, ids) == 99          # nothing was dropped
        wait_idle(state)
        assert c.post(path, headers=OPERATOR).status_code == 200
        assert cached(c, ALPHA, ids) == 0           # dropped for every tenant
    settle(state)
