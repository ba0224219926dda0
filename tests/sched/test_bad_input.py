"""Bad input raises a clear error naming the value, and changes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.sched.policy import QUEUE_ORDERS, RETRACT_ORDERS
from radixkv.sched.request import Request

from ._helpers import make_engine, toks


def test_request_larger_than_kv_capacity_is_refused_naming_sizes():
    eng = make_engine(512, CacheConfig(), SchedulerConfig())
    big = Request("big", toks(0, 500), 13)
    with pytest.raises(ValueError, match=r"'big' needs 513 KV slots \(prompt 500 \+ up to 13 "
                                         r"new\) but kv_capacity is 512"):
        eng.add_request(big)
    assert eng.requests == [] and not eng.has_work()
    ok = eng.add_request(Request("ok", toks(0, 500), 12))        # exactly 512 fits
    assert eng.requests == [ok]


def test_request_capacity_check_rounds_to_pages():
    eng = make_engine(512, CacheConfig("radix", 16), SchedulerConfig())
    with pytest.raises(ValueError, match="needs 528 KV slots"):    # 513 -> 33 pages of 16
        eng.add_request(Request("r", toks(0, 500), 13))
    eng.add_request(Request("fits", toks(0, 500), 0, forced_output=toks(9000, 11)))  # 512
    eng.run_until_idle()


@pytest.mark.parametrize("cls, field, value, valid", [
    (SchedulerConfig, "policy", "lpmx", QUEUE_ORDERS.names()),
    (SchedulerConfig, "policy", None, QUEUE_ORDERS.names()),
    (SchedulerConfig, "retract_policy", "oldest", RETRACT_ORDERS.names()),
    (CacheConfig, "kind", "trie", ("radix", "blockhash", "none")),
    (CacheConfig, "eviction", "lruu", ("lru", "mru", "fifo", "filo", "lfu", "slru", "priority", "belady")),
    (CacheConfig, "hash_algo", "md5", ("sha256", "xxhash")),
])
def test_unknown_names_list_the_valid_ones(cls, field, value, valid):
    with pytest.raises(ValueError) as ei:
        cls(**{field: value})
    msg = str(ei.value)
    assert f"{cls.__name__}.{field}" in msg and repr(value) in msg
    assert all(name in msg for name in valid)


@pytest.mark.parametrize("kw, needle", [
    (dict(max_prefill_tokens=0), "max_prefill_tokens must be an int >= 1, got 0"),
    (dict(max_running_requests=True), "max_running_requests must be an int >= 1, got True"),
    (dict(chunked_prefill_size=-1), "chunked_prefill_size must be an int >= 0, got -1"),
    (dict(init_new_token_ratio=1.5), "init_new_token_ratio must be in [0, 1], got 1.5"),
    (dict(init_new_token_ratio=0.1, min_new_token_ratio=0.2), "must not exceed"),
])
def test_bad_scheduler_numbers(kw, needle):
    with pytest.raises(ValueError) as ei:
        SchedulerConfig(**kw)
    assert needle in str(ei.value)


def test_bad_engine_config():
    with pytest.raises(ValueError, match="kv_capacity must be an int >= 1, got 0"):
        EngineConfig(kv_capacity=0)
    with pytest.raises(ValueError, match="kv_capacity 100 is not a multiple of page size 16"):
        EngineConfig(kv_capacity=100, cache=CacheConfig(page_size=16))


@pytest.mark.parametrize("prompt, needle", [
    ([1, -2, 3], "token id -2 is out of range"),
    ([1, 2**32], "token id 4294967296 is out of range"),
    ([1, 2.5], "token id 2.5 is not an int"),
    (["a"], "token id 'a' is not an int"),
    (np.array([3, -1]), "token id -1 is out of range"),
    ([], "request 'r' has an empty prompt"),
])
def test_bad_prompts(prompt, needle):
    with pytest.raises(ValueError) as ei:
        Request("r", prompt, 4)
    assert needle in str(ei.value)


@pytest.mark.parametrize("max_new", [0, -3, True, 2.0, None])
def test_bad_max_new_tokens(max_new):
    with pytest.raises(ValueError, match=f"request 'r': max_new_tokens must be an int >= 1, "
                                         f"got {max_new!r}"):
        Request("r", [1, 2, 3], max_new)


def test_scripted_request_ignores_max_new_tokens():
    r = Request("r", [1, 2, 3], 0, forced_output=[7, 8])
    assert r.max_new_tokens == 3                          # the reply, then the stop


def test_regression_request_prompt_from_an_iterator():
    """Request copied its token list from `prompt` after RadixKey had consumed it: a
    generator prompt left `tokens` empty (prompt_len 0) beside a 3-token key."""
    r = Request("r", (t for t in [5, 6, 7]), 2)
    assert r.tokens == [5, 6, 7] and r.prompt_len == 3 and len(r.prompt_key) == 3
    assert Request("a", np.array([5, 6, 7]), 2).tokens == [5, 6, 7]
    assert Request("k", r.prompt_key, 2).tokens == [5, 6, 7]
    assert Request("t", (5, 6, 7), 2).tokens == [5, 6, 7]


@pytest.mark.parametrize("kw, needle", [
    (dict(session=["u1"]), r"request 'r': session must be a str or None, got \['u1'\]"),
    (dict(session=7), r"request 'r': session must be a str or None, got 7"),
    (dict(turn=-1), r"request 'r': turn must be an int >= 0, got -1"),
    (dict(turn=1.5), r"request 'r': turn must be an int >= 0, got 1.5"),
    (dict(turn=True), r"request 'r': turn must be an int >= 0, got True"),
])
def test_bad_session_or_turn_is_refused_by_name(kw, needle):
    # an unhashable session used to pass here and then lose the request inside Engine.step
    with pytest.raises(ValueError, match=needle):
        Request("r", toks(0, 10), 2, **kw)
