"""Generators: determinism, the documented shapes, vocabulary bounds, the registry."""
from __future__ import annotations

import math

import pytest

from radixkv.workloads import (GENERATORS, burst, fewshot, load_workload, make_workload,
                               multiturn, rag, read_jsonl, support, tree, write_jsonl)

# Small sizes keep the whole suite fast; the shape tests use the defaults.
SMALL = {
    "support": dict(num_users=6, turns=3, system_len=20, fewshot_len=30, rag_len=40),
    "fewshot": dict(num_questions=20, preamble_len=50),
    "multiturn": dict(num_users=5, turns=3),
    "burst": dict(num_requests=8, prefix_len=40),
    "tree": dict(num_trees=2, branching=2, depth=2, root_len=30),
    "rag": dict(num_requests=20, num_docs=10, doc_len=30),
}


@pytest.fixture(scope="module")
def sup():
    return support()


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_deterministic_per_seed(name):
    a = make_workload(name, seed=1, **SMALL[name])
    assert a == make_workload(name, seed=1, **SMALL[name])
    b = make_workload(name, seed=2, **SMALL[name])
    assert [r.prompt for r in a] != [r.prompt for r in b]


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_small_vocab_bounds_and_rate(name):
    w = make_workload(name, vocab_size=256, rate=5.0, **SMALL[name])
    toks = {t for r in w for t in r.prompt + r.output}
    assert min(toks) >= 0 and max(toks) <= 255 and len(toks) > 200
    arrivals = [r.arrival for r in w]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert all(r.output_len == len(r.output) for r in w)
    assert w.meta["rate"] == 5.0 and w.meta["vocab_size"] == 256


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_content_independent_of_rate(name):
    offline = make_workload(name, rate=None, **SMALL[name])
    timed = make_workload(name, rate=3.0, **SMALL[name])
    assert all(r.arrival == 0.0 for r in offline)
    # Offline order is the timed order at the nominal rate; content is the same either way.
    assert {r.id: r.prompt for r in offline} == {r.id: r.prompt for r in timed}
    assert make_workload(name, rate=math.inf, **SMALL[name]) == offline


def test_support_default_shape(sup):
    assert len(sup) == 1200
    chat = [r for r in sup if "-rag" not in r.id]
    rags = [r for r in sup if "-rag" in r.id]
    assert len(chat) == 1000 and len(rags) == 200 and len(rags) / len(chat) == 0.2
    s = chat[0].prompt[:512]
    sf = chat[0].prompt[:512 + 1543]
    assert all(r.prompt[:2055] == sf for r in chat)
    for r in rags:
        assert len(r.prompt) == 512 + 2112 and r.prompt[:512] == s
        assert r.prompt[512:2055] != sf[512:]  # no few-shot block
    assert len({r.prompt[512:] for r in rags}) == 200
    for r in chat:
        assert 40 <= len(r.prompt) - 2055 and 100 <= r.output_len <= 400


def test_support_turns_extend_previous_turn(sup):
    by_id = {r.id: r for r in sup}
    for u in range(200):
        for t in range(4):
            prev, nxt = by_id[f"support-u{u}-t{t}"], by_id[f"support-u{u}-t{t + 1}"]
            assert nxt.prompt[:len(prev.prompt) + prev.output_len] == prev.prompt + prev.output
            assert 40 <= len(nxt.prompt) - len(prev.prompt) - prev.output_len <= 160
            assert nxt.session == prev.session == f"u{u}"
    # Offline: turn order survives in the list order.
    pos = {r.id: i for i, r in enumerate(sup)}
    assert all(pos[f"support-u{u}-t{t}"] < pos[f"support-u{u}-t{t + 1}"]
               for u in range(200) for t in range(4))


def test_support_timed_turns_keep_order():
    w = support(num_users=30, rate=2.0, seed=4)
    by_id = {r.id: r for r in w}
    for u in range(30):
        times = [by_id[f"support-u{u}-t{t}"].arrival for t in range(5)]
        # think time plus at least 100 reply tokens x 0.02 s between turns
        assert all(b - a >= 2.0 for a, b in zip(times, times[1:]))


def test_burst_default_shape():
    w = burst()
    assert len(w) == 64 and all(r.arrival == 0.0 for r in w)
    prefix = w[0].prompt[:2000]
    assert all(len(r.prompt) == 2032 and r.prompt[:2000] == prefix for r in w)
    assert len({r.prompt[2000:] for r in w}) == 64
    assert all(8 <= r.output_len <= 32 for r in w)


def test_fewshot_multiturn_tree_rag_shapes():
    f = fewshot(num_questions=50)
    assert len(f) == 50 and all(r.prompt[:4000] == f[0].prompt[:4000] for r in f)
    m = multiturn(num_users=4, turns=3, system_len=0)
    assert len(m) == 12 and len({r.prompt[:20] for r in m if r.id.endswith("-t0")}) == 4
    t = tree()
    assert len(t) == 4 * (1 + 3 + 9 + 27)
    by_id = {r.id: r for r in t}
    for r in t:
        if "." in r.id:
            parent = by_id[r.id.rsplit(".", 1)[0]]
            assert r.prompt[:len(parent.prompt) + parent.output_len] == \
                parent.prompt + parent.output
            assert 16 <= len(r.prompt) - len(parent.prompt) - parent.output_len <= 48
    g = rag(num_requests=100)
    lens = {len(r.prompt) - 256 - 3 * 2000 for r in g}
    assert min(lens) >= 16 and max(lens) <= 64
    assert all(r.prompt[:256] == g[0].prompt[:256] for r in g)


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown workload 'nope'.*support"):
        make_workload("nope")
    with pytest.raises(ValueError, match="unknown parameter 'users'.*num_users"):
        make_workload("support", users=3)
    with pytest.raises(ValueError, match="rate"):
        make_workload("burst", rate=-1)
    with pytest.raises(ValueError, match="msg_len"):
        support(msg_len=(50, 10))
    with pytest.raises(ValueError, match="vocab_size"):
        burst(vocab_size=1)
    with pytest.raises(ValueError, match="neither a workload name"):
        load_workload("/no/such/file.jsonl")


def test_load_workload_name_and_jsonl(tmp_path):
    w = load_workload("burst", num_requests=3, seed=5)
    assert len(w) == 3 and w.meta["seed"] == 5
    p = tmp_path / "b.jsonl"
    write_jsonl(w, p)
    assert load_workload(str(p)) == w == read_jsonl(p)
    with pytest.raises(ValueError, match="unknown parameter 'limit'"):
        load_workload(p, limit=2)
