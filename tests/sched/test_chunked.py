"""Chunked prefill: a long prompt is computed over ceil(len / chunk) steps, every chunk's KV
enters the cache as soon as it is computed, and the first token comes after the last chunk.

While a request is being chunked no waiting request is admitted (one chunked request at a
time, as in SGLang); a request admitted in the round of the last chunk already hits the
chunks before it."""
from __future__ import annotations

import math

import pytest

from radixkv.cache.key import RadixKey
from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sched.request import Request

from ._helpers import make_engine, toks

CHUNK = 64


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("length", [64, 65, 192, 200, 1000])
def test_long_prompt_is_prefilled_in_chunks(length, page_size):
    eng = make_engine(4096, CacheConfig("radix", page_size),
                      SchedulerConfig(chunked_prefill_size=CHUNK), check=True)
    prompt = toks(10_000, length)
    r = eng.add_request(Request("long", prompt, 0, forced_output=toks(90_000, 3)))
    n_chunks = math.ceil(length / CHUNK)
    for j in range(1, n_chunks + 1):
        assert eng.step()
        done = min(j * CHUNK, length)
        assert r.num_computed == done
        assert eng.executor.steps[-1] == [("long", (j - 1) * CHUNK, done - (j - 1) * CHUNK,
                                           j == n_chunks, "extend")]
        # the computed part is in the tree (whole pages), locked by the request
        cached = eng.cache.match_prefix(RadixKey(prompt), split=False).prefix_len
        assert cached == done - done % page_size
        assert eng.cache.protected_size() == cached
        if j < n_chunks:
            assert r.first_token is None                  # no token before the last chunk
            assert eng.sched.chunked is r
    assert r.first_token == eng.timeline["t"][n_chunks - 1] == eng.now
    assert eng.sched.chunked is None and eng.sched.running == [r]
    eng.run_until_idle()
    assert r.output == toks(90_000, 3)
    assert r.prefill_tokens == length and r.cached_tokens == 0


def test_chunks_start_after_a_cached_prefix():
    eng = make_engine(4096, CacheConfig(), SchedulerConfig(chunked_prefill_size=CHUNK), check=True)
    base = toks(10_000, 100)
    first = eng.add_request(Request("first", base, 0, forced_output=()))
    eng.run_until_idle()
    assert first.status.value == "finished"
    second = eng.add_request(Request("second", base + toks(20_000, 200), 0, forced_output=(),
                                     arrival=eng.now))
    eng.run_until_idle()
    steps = [s for s in eng.executor.steps if s[0][0] == "second"]
    # 300 - 100 cached = 200 new tokens: 64 + 64 + 64 + 8
    assert [(seg[1], seg[2]) for (seg,) in steps] == [(100, 64), (164, 64), (228, 64), (292, 8)]
    assert second.cached_tokens == 100 and second.prefill_tokens == 200


@pytest.mark.parametrize("extra", [0, 1])
def test_request_admitted_with_the_last_chunk_hits_the_earlier_chunks(extra):
    eng = make_engine(4096, CacheConfig(), SchedulerConfig(chunked_prefill_size=CHUNK), check=True)
    prompt = toks(10_000, 200)                           # chunks 64, 64, 64, 8
    a = eng.add_request(Request("a", prompt, 0, forced_output=toks(90_000, 2), index=0))
    # b shares a's first 100 tokens (extra=0) or all 200 of them (extra=1)
    b_prompt = prompt[:100] + toks(30_000, 20) if not extra else prompt + toks(30_000, 10)
    b = eng.add_request(Request("b", b_prompt, 0, forced_output=toks(91_000, 2), index=1))
    for _ in range(3):
        eng.step()
        assert b.first_admit is None                     # nothing is admitted mid-chunking
    eng.step()
    last = eng.executor.steps[3]
    hit = 100 if not extra else 192                      # a's last 8 tokens are computed now
    assert last == [("a", 192, 8, True, "extend"),
                    ("b", hit, len(b_prompt) - hit, True, "extend")]
    assert b.cached_tokens == hit and b.first_admit == eng.timeline["t"][2]
    assert a.first_token == b.first_token == eng.timeline["t"][3]
    eng.run_until_idle()
    assert a.output == toks(90_000, 2) and b.output == toks(91_000, 2)


def test_regression_chunk_decode_reserve_counted_twice():
    """A chunked request's decode reserve was counted twice from its second chunk on (once
    in Scheduler._reserved, once in PrefillAdder.add_chunk): a lone request that fits
    kv_capacity (100 + 50 <= 160) stopped at 80 computed tokens and never finished."""
    eng = make_engine(160, CacheConfig(), SchedulerConfig(chunked_prefill_size=16), check=True)
    r = eng.add_request(Request("r", toks(0, 100), 0, forced_output=toks(500, 49)))
    assert r.max_new_tokens == 50
    eng.run_until_idle()
    assert r.output == toks(500, 49)
    assert [seg[2] for step in eng.executor.steps for seg in step if seg[4] == "extend"] == \
        [16] * 6 + [4]
