"""The pages in flight on one replica, registered as far as routing hashed them (router/flying.py)
and the prompts' hashes computed lazily (kvevents/hashes.py), against a naive model that hashes
every prompt whole and counts every page: the same matches, the same distinct pages, after
every step of random routes and finishes over prompts that share prefixes across span
boundaries."""
from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.kvevents.hashes import PageHashes, page_hashes
from radixkv.router.flying import FlyingPages

NS = (None, None)
SPAN = 64
# prompts sharing prefixes of 0..3 spans and odd lengths, one token a page
BASES = [[7] * 300, list(range(300)), [7] * 130 + list(range(500, 700))]


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    base = rng.choice(BASES)
    cut = rng.choice([0, 1, 63, 64, 65, 127, 128, 129, 200, 300])
    tail = [rng.randrange(1000, 1003) for _ in range(rng.choice([0, 1, 2, 70, 150]))]
    return (base[:cut] + tail) or [1]


def naive_run(held: dict, flying: Counter, hashes: list[int]) -> int:
    return next((k for k, h in enumerate(hashes) if h not in held and h not in flying),
                len(hashes))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "ask"]), st.integers(0, 40)),
                max_size=40),
       st.integers(0, 39))
def test_matches_and_distinct_pages_agree_with_whole_hashing(steps, held_seed):
    fp, naive, live = FlyingPages(), Counter(), {}
    held = dict.fromkeys(page_hashes(prompt(held_seed), NS, 1)[:SPAN + 3], 1)
    for i, (op, seed) in enumerate(steps):
        toks, rid = prompt(seed), f"r{i}"
        if op == "add":
            lazy = PageHashes(toks, NS, 1)
            start = next((k for k, h in enumerate(lazy) if h not in held), len(lazy))
            if start < len(lazy):                   # read as routing reads: up to its match
                fp.run(held, lazy, start)
            fp.add(rid, lazy)
            whole = page_hashes(toks, NS, 1)
            live[rid] = whole
            naive.update(whole)
        elif op == "remove" and live:
            gone = sorted(live)[seed % len(live)]
            fp.remove(gone)
            naive.subtract(live.pop(gone))
            naive = +naive
        else:
            lazy, whole = PageHashes(toks, NS, 1), page_hashes(toks, NS, 1)
            start = next((k for k, h in enumerate(whole) if h not in held), len(whole))
            got = fp.run(held, lazy, start) if fp else start
            assert got == naive_run(held, naive, whole)
            assert lazy.done <= max(got + SPAN, SPAN)     # hashed about as far as it matched
        assert fp.distinct() == len(naive)
        assert set(fp.count) <= set(naive)
        assert all(fp.count[h] == naive[h] for h in fp.count)
    for rid in list(live):
        fp.remove(rid)
    assert not fp and fp.count == {} and fp.distinct() == 0


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("ns", [NS, ("lora", None), (None, "salt")])
def test_lazy_hashes_are_the_whole_hashes_however_they_are_read(page_size, ns):
    toks = list(range(3000)) + [5] * 7
    whole = page_hashes(toks, ns, page_size)
    assert list(PageHashes(toks, ns, page_size)) == whole
    lazy = PageHashes(toks, ns, page_size)
    assert lazy[70] == whole[70] and lazy.done == 2 * SPAN          # two spans read, no more
    assert lazy[-1] == whole[-1] and lazy.done == len(whole)
    assert lazy[3:9] == whole[3:9] and len(lazy) == len(whole) == len(toks) // page_size
    backwards = PageHashes(toks, ns, page_size)
    assert backwards[100:2:-3] == whole[100:2:-3] and backwards[::-1] == whole[::-1]
    first = PageHashes(toks, ns, page_size, salt_first_only=True)
    assert first[:5] == page_hashes(toks, ns, page_size, salt_first_only=True)[:5]
    with pytest.raises(IndexError, match="page"):
        lazy[len(whole)]


def test_a_fresh_prompt_is_hashed_one_span_far_and_a_later_twin_registers_the_rest():
    """The lazy registration's point and its repair: a fresh 3,000-page prompt routed hashes 64
    pages; a second prompt equal to it on 2,000 pages, asked on the same replica, matches all
    2,000 as in flight (the first prompt's pages registered span by span as it reads on)."""
    fp = FlyingPages()
    a = list(range(3000))
    ha = PageHashes(a, NS, 1)
    fp.add("a", ha)
    assert ha.done == SPAN and fp.distinct() == 3000 and len(fp.count) == SPAN
    b = a[:2000] + [9] * 500
    hb = PageHashes(b, NS, 1)
    assert fp.run({}, hb, 0) == 2000
    assert ha.done == 2048 and len(fp.count) == 2048 and fp.distinct() == 3000
    fp.add("b", hb)
    assert fp.distinct() == 3000 + 500
    fp.remove("a")
    assert fp.distinct() == 2500 and fp.count == dict.fromkeys(hb.extend_to(hb.done), 1)
    fp.remove("b")
    assert fp.count == {} and fp.distinct() == 0
