"""Near-valid request bodies for fuzzing HTTP endpoints, and the checks every answer passes.

A case is `(content bytes, content-type or None)`. `near(fields)` builds JSON objects from each
field's valid values, now and then swapping a value for one of the wrong type, out of range,
huge, negative, NaN or infinite (written as the raw `NaN` / `Infinity` tokens), odd unicode
(a lone surrogate) or nested wrongly, dropping it, or adding an unknown key; `cases(bodies)`
sends those as JSON, wrapped wrongly (a list, a string), truncated, under the wrong
content-type, and mixes in empty bodies, random bytes and invalid UTF-8.
"""
from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, settings, strategies as st

MODEL = "llama-3-8b"
MISSING = object()                 # the field is left out
FUZZ = settings(max_examples=500, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

# ---- wrong values for any field -----------------------------------------------------------------
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5),
    st.integers(2**63 - 2, 2**80), st.integers(-(2**80), -(2**31)),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([float("nan"), float("inf"),
                                                                     -float("inf"), 1e308, -0.0]),
    st.text(max_size=12), st.sampled_from(["", "\ud800", "\udfff x", "１２", "\x00", "é" * 40]))
JUNK = st.one_of(_scalar, st.lists(_scalar, max_size=3),
                 st.dictionaries(st.text(max_size=6), _scalar, max_size=3))


def near(fields: dict, required: frozenset = frozenset(), keep: frozenset = frozenset()):
    """Objects with `fields` (name -> strategy of valid values): each field is valid most of the
    time, else junk, else left out (a `required` one too, a `keep` one never: those bound the
    work a valid request asks for); sometimes an unknown key beside them."""
    def choice(name, valid):
        options = [valid, valid, valid, JUNK]
        if name not in keep:
            options.append(st.just(MISSING))
        return st.one_of(*options)

    base = st.fixed_dictionaries({k: choice(k, v) for k, v in fields.items()})
    extra = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in fields),
                            JUNK, max_size=1)
    return st.builds(lambda b, x: {**{k: v for k, v in b.items() if v is not MISSING}, **x},
                     base, extra)


def valid(fields: dict, optional: frozenset = frozenset()):
    """Objects of valid values only (an `optional` field may be left out)."""
    return st.fixed_dictionaries({k: v for k, v in fields.items() if k not in optional},
                                 optional={k: v for k, v in fields.items() if k in optional})


def _dumps(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


JSON = "application/json"


def cases(bodies):
    """(content, content-type) cases around the JSON objects `bodies` draws."""
    as_json = bodies.map(lambda b: (_dumps(b), JSON))
    return st.one_of(
        as_json, as_json, as_json, as_json,
        bodies.map(lambda b: (_dumps([b]), JSON)),                           # wrong nesting
        bodies.map(lambda b: (_dumps(json.dumps(b)), JSON)),                 # a JSON string
        st.tuples(bodies, st.integers(1, 40)).map(lambda t: (_dumps(t[0])[:-t[1]], JSON)),
        st.tuples(bodies, st.sampled_from([None, "text/plain", "application/x-www-form-urlencoded",
                                           "multipart/form-data; boundary=x"]))
        .map(lambda t: (_dumps(t[0]), t[1])),
        st.sampled_from([b"", b"null", b"[]", b"{}", b"0", b'"x"', b"NaN", b"\xff\xfe{}",
                         b'{"prompt": "\xc3\x28"}', b"{" * 64, b'{"a":' * 2000]).map(
            lambda c: (c, JSON)),
        st.binary(max_size=48).map(lambda c: (c, JSON)))


# ---- the answers --------------------------------------------------------------------------------
def post(c: httpx.Client, path: str, case, headers: dict | None = None) -> httpx.Response:
    content, ctype = case
    h = dict(headers or {})
    if ctype is not None:
        h["content-type"] = ctype
    return c.post(path, content=content, headers=h)


def check_answer(r: httpx.Response, case) -> None:
    """No 5xx; a 4xx carries the OpenAI error body, its code the status."""
    assert r.status_code < 500, (r.status_code, case, r.text[:400])
    if r.status_code >= 400:
        body = r.json()
        assert body.get("object") == "error" and set(body) == {"object", "error"}, body
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and err["message"], err
        assert isinstance(err["type"], str) and err["code"] == r.status_code, err
        assert err["param"] is None or isinstance(err["param"], str), err


# ---- the fields of each API, valid values bounded to a few tokens of work ------------------------
_text = st.one_of(st.text(min_size=1, max_size=24),
                  st.sampled_from(["\ud800", "a\udfff", "é🙂", "\x00", "\u202e"]))
_ids = st.lists(st.integers(0, 5000), min_size=1, max_size=16)
_small = st.integers(1, 3)
SAMPLING = {"model": st.just(MODEL), "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1),
            "top_k": st.integers(-1, 40), "seed": st.integers(0, 2**63 - 1),
            "stream": st.booleans(), "stream_options": st.fixed_dictionaries(
                {"include_usage": st.booleans()}), "ignore_eos": st.booleans(),
            "stop_token_ids": st.lists(st.integers(0, 5000), max_size=3),
            "return_cached_tokens_details": st.booleans(), "user": st.text(max_size=8),
            "n": st.just(1), "echo": st.just(False), "cache_scope": st.just("tenant")}
MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "developer", "tool"]),
    "content": st.one_of(_text, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": _text}), max_size=2))})
COMPLETION = {**SAMPLING, "prompt": st.one_of(_text, _ids), "max_tokens": _small}
CHAT = {**SAMPLING, "messages": st.lists(MESSAGE, min_size=1, max_size=3),
        "max_tokens": _small, "max_completion_tokens": _small}
GENERATE = {"text": _text, "input_ids": _ids, "stream": st.booleans(),
            "return_cached_tokens_details": st.booleans()}
SGLANG_SAMPLING = {"max_new_tokens": _small, "temperature": st.floats(0, 2),
                   "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 40),
                   "ignore_eos": st.booleans(), "stop_token_ids": st.lists(st.integers(0, 5000),
                                                                         max_size=3)}
TOKENIZE = {"model": st.just(MODEL), "prompt": _text, "messages": st.lists(MESSAGE, min_size=1,
                                                                          max_size=3),
            "add_special_tokens": st.booleans(), "add_generation_prompt": st.just(True),
            "return_token_strs": st.booleans()}
DETOKENIZE = {"model": st.just(MODEL), "tokens": st.lists(st.integers(0, 128_255), max_size=24)}

_keep_cmpl = frozenset({"max_tokens"})
_keep_chat = frozenset({"max_tokens", "max_completion_tokens"})
completion_bodies = st.one_of(valid(COMPLETION, frozenset(SAMPLING)),
                              near(COMPLETION, keep=_keep_cmpl))
chat_bodies = st.one_of(valid(CHAT, frozenset(SAMPLING)), near(CHAT, keep=_keep_chat))


def _but(fields: dict, key: str) -> dict:
    return {k: v for k, v in fields.items() if k != key}


generate_bodies = st.builds(
    lambda b, sp: {**b, "sampling_params": sp},
    st.one_of(valid(_but(GENERATE, "text"), frozenset({"stream", "return_cached_tokens_details"})),
              valid(_but(GENERATE, "input_ids"), frozenset({"stream",
                                                           "return_cached_tokens_details"})),
              near(GENERATE)),
    st.one_of(valid(SGLANG_SAMPLING, frozenset(SGLANG_SAMPLING) - {"max_new_tokens"}),
              near(SGLANG_SAMPLING, keep=frozenset({"max_new_tokens"})),
              _scalar, st.lists(_scalar, max_size=3)))     # a dict would default to 128 tokens
tokenize_bodies = st.one_of(valid(_but(TOKENIZE, "messages"), frozenset(TOKENIZE) - {"prompt"}),
                            valid(_but(TOKENIZE, "prompt"), frozenset(TOKENIZE) - {"messages"}),
                            near(TOKENIZE))
detokenize_bodies = st.one_of(valid(DETOKENIZE, frozenset({"model"})), near(DETOKENIZE))
any_bodies = st.one_of(st.just({}), JUNK, near(COMPLETION))
