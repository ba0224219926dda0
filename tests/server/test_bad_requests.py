"""Bad requests get a 4xx with an OpenAI-style error body, never a 5xx, and change nothing:
no token counted, nothing cached, no slot held. Fuzzed bodies (hypothesis) likewise."""
from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.server._helpers import check_clean, metric, on_engine, running_server, wait_idle

MODEL = "llama-3-8b"


@pytest.fixture(scope="module")
def server():
    with running_server(executor="sim", model=MODEL, kv_capacity=4096) as s:
        yield s


def _post(url: str, body, path: str = "/v1/completions", **kw) -> httpx.Response:
    if isinstance(body, (str, bytes)):
        return httpx.post(url + path, content=body, headers={"content-type": "application/json"},
                          timeout=30, **kw)
    return httpx.post(url + path, json=body, timeout=30, **kw)


CASES = [
    ("malformed JSON", b'{"model": "llama-3-8b", "prompt": [1, 2', 400, None),
    ("not an object", b"[1, 2, 3]", 400, None),
    ("unknown model", {"model": "gpt-9", "prompt": "hi"}, 404, "gpt-9"),
    ("negative max_tokens", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("zero max_tokens", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("over the context", {"prompt": list(range(8000)), "max_tokens": 500}, 400,
     "maximum context length is 8192"),
    ("over the pool", {"prompt": list(range(4000)), "max_tokens": 150}, 400, "kv_capacity"),
    ("token id out of vocabulary", {"prompt": [1, 2, 128256]}, 400, "128256"),
    ("negative token id", {"prompt": [1, -2]}, 400, None),
    ("empty prompt", {"prompt": []}, 400, None),
    ("empty string prompt", {"prompt": ""}, 400, None),
    ("n = 2", {"prompt": "hi", "n": 2}, 400, "n=2"),
    ("logprobs 0", {"prompt": "hi", "logprobs": 0}, 400, "logprobs"),
    ("stop strings", {"prompt": "hi", "stop": ["\n"]}, 400, "stop_token_ids"),
    ("temperature a string", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("client cache salt", {"prompt": "hi", "cache_salt": "x"}, 400, "--allow-client-cache-salt"),
    ("shared scope without namespace", {"prompt": "hi", "cache_scope": "shared"}, 400, "shared"),
    ("bad scope", {"prompt": "hi", "cache_scope": "everyone"}, 400, "cache_scope"),
]


@pytest.mark.parametrize("what,body,status,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_refused_and_changes_nothing(server, what, body, status, needle):
    url, state = server
    before = metric(url, "vllm:prefix_cache_queries_total")
    tree = on_engine(state, lambda e: e.cache.total_size())
    r = _post(url, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"]
    if needle:
        assert needle in err["message"] + str(err["param"])
    assert metric(url, "vllm:prefix_cache_queries_total") == before
    assert on_engine(state, lambda e: e.cache.total_size()) == tree
    check_clean(state)


def test_bad_chat_requests(server):
    url, state = server
    for body, status in [({"messages": []}, 400),
                         ({"messages": [{"role": "wizard", "content": "hi"}]}, 400),
                         ({"messages": [{"role": "user", "content": 5}]}, 400),
                         ({"messages": [{"role": "user", "content": "hi"}],
                           "max_completion_tokens": -1}, 400)]:
        r = _post(url, body, "/v1/chat/completions")
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["code"] == status
    assert httpx.get(url + "/v1/nope").status_code == 404
    check_clean(state)


ROLE_CHECK = ("{% for m in messages %}{% if loop.index0 == 0 and m.role != 'user' %}"
              "{{ raise_exception('Conversations must start with a user message') }}{% endif %}"
              "[{{ m.role }}] {{ m.content }}\n{% endfor %}")


def test_regression_a_checkpoint_template_refusal_is_a_400(server):
    """A checkpoint's Jinja chat template that calls raise_exception (as most HF templates do
    on a bad role order) used to fail with an undefined name, a 500."""
    from radixkv.server.text import ChatTemplate
    url, state = server
    plain = state.template
    state.template = ChatTemplate(state.tokenizer, ROLE_CHECK)
    try:
        bad = {"messages": [{"role": "assistant", "content": "hi"}], "max_tokens": 2}
        r = _post(url, bad, "/v1/chat/completions")
        assert r.status_code == 400, r.text
        assert "must start with a user message" in r.json()["error"]["message"]
        ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert _post(url, ok, "/v1/chat/completions").status_code == 200
    finally:
        state.template = plain
    check_clean(state)


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                     | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids, max_size=5),
                     max_leaves=20)
_fields = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from([MODEL, "x", ""]) | _json,
    "prompt": st.text(max_size=50) | st.lists(st.integers(-5, 200_000), max_size=60) | _json,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bad"]),
                                                "content": st.text(max_size=30) | _json}),
                         max_size=3) | _json,
    "max_tokens": st.integers(-3, 10_000) | _json,
    "temperature": st.floats(-1, 3) | _json,
    "top_p": st.floats(-1, 2) | _json,
    "top_k": st.integers(-3, 50),
    "stream": st.booleans(),
    "stop_token_ids": st.lists(st.integers(-3, 200_000), max_size=3) | _json,
    "n": st.integers(0, 3),
    "cache_salt": st.text(max_size=5) | _json,
    "seed": st.integers(-3, 2**64),
})


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_fields | _json, chat=st.booleans())
def test_fuzzed_bodies_never_5xx(server, body, chat):
    url, state = server
    if isinstance(body, dict) and "max_tokens" in body and isinstance(body["max_tokens"], int):
        body["max_tokens"] = min(body["max_tokens"], 4)          # keep accepted ones short
    r = _post(url, body, "/v1/chat/completions" if chat else "/v1/completions")
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]["code"] == r.status_code
    wait_idle(state)
    check_clean(state)                  # accepted or refused, nothing is left held
