"""Queue orders: the exact admission order of one scheduling round, per policy, and the
CacheManager's match memo that keeps cache-aware orders cheap."""
from __future__ import annotations

import random


from radixkv.sched.batch import StepResult
from radixkv.sched.request import Request

from ._helpers import admitted_order, make_scheduler, toks, warm

A, B, C = toks(1000, 100), toks(2000, 50), toks(3000, 10)


def lpm_requests():
    # (rid, prompt): the pure-read match of prompt[:-1] is in the comment
    return [
        ("r0", toks(9000, 20)),              # 0: nothing cached
        ("r1", B + toks(5000, 5)),           # 50
        ("r2", A[:30] + toks(6000, 5)),      # 30: diverges inside A's edge
        ("r3", A + toks(7000, 5)),           # 100
        ("r4", C + toks(8000, 5)),           # 10
        ("r5", B + toks(5100, 5)),           # 50, ties with r1: arrival order
        ("r6", list(A)),                     # 99: the last prompt token is always computed
    ]


def add_all(sched, specs, **per):
    reqs = []
    for i, (rid, prompt) in enumerate(specs):
        kw = {k: v[i] for k, v in per.items()}
        kw.setdefault("arrival", float(i))
        r = Request(rid, prompt, kw.pop("max_new_tokens", 4), index=i, **kw)
        sched.add(r)
        reqs.append(r)
    return reqs


def warm_lpm(sched):
    for t in (A, B, C):
        warm(sched, t)


def test_lpm_admits_longest_cached_prefix_first():
    s = make_scheduler(policy="lpm")
    warm_lpm(s)
    add_all(s, lpm_requests())
    assert admitted_order(s) == [("r3", 100), ("r6", 99), ("r1", 50), ("r5", 50), ("r2", 30),
                                 ("r4", 10), ("r0", 0)]
    s.mgr.check()


def test_lpm_order_is_the_sorted_pure_read_match():
    s = make_scheduler(policy="lpm")
    warm_lpm(s)
    reqs = add_all(s, lpm_requests())
    before = s.mgr.cache.num_nodes()
    ordered = s._ordered_waiting()
    assert s.mgr.cache.num_nodes() == before              # asking split nothing
    assert [r.rid for r in ordered] == ["r3", "r6", "r1", "r5", "r2", "r4", "r0"]
    assert [s.ctx.prefix(r)[0] for r in ordered] == [100, 99, 50, 50, 30, 10, 0]
    assert len(reqs) == 7


def test_fcfs_keeps_arrival_order_whatever_is_cached():
    s = make_scheduler(policy="fcfs")
    warm_lpm(s)
    specs = lpm_requests()
    arrivals = [0.5, 0.1, 0.4, 0.3, 0.2, 0.6, 0.0]        # added out of arrival order
    add_all(s, specs, arrival=arrivals)
    order = [rid for rid, _ in admitted_order(s)]
    assert order == [specs[i][0] for i in sorted(range(7), key=arrivals.__getitem__)]
    assert order == ["r6", "r1", "r4", "r3", "r2", "r0", "r5"]


def test_fcfs_breaks_arrival_ties_by_index():
    s = make_scheduler(policy="fcfs")
    for i in (3, 1, 2, 0):
        s.add(Request(f"q{i}", toks(100 * i, 5), 2, arrival=1.0, index=i))
    assert [rid for rid, _ in admitted_order(s)] == ["q0", "q1", "q2", "q3"]


def test_priority_higher_first_fcfs_among_equals():
    s = make_scheduler(policy="priority")
    warm_lpm(s)
    add_all(s, lpm_requests(), priority=[0, 2, 1, 2, 0, -1, 1])
    assert [rid for rid, _ in admitted_order(s)] == ["r1", "r3", "r2", "r6", "r0", "r4", "r5"]


def test_lof_longest_remaining_output_first():
    s = make_scheduler(policy="lof")
    add_all(s, lpm_requests(), max_new_tokens=[5, 50, 7, 50, 1, 9, 20])
    assert [rid for rid, _ in admitted_order(s)] == ["r1", "r3", "r6", "r5", "r2", "r0", "r4"]


def test_random_is_seeded_and_deterministic():
    def order(seed):
        s = make_scheduler(policy="random", seed=seed)
        add_all(s, lpm_requests())
        return [rid for rid, _ in admitted_order(s)]

    fcfs = [rid for rid, _ in lpm_requests()]
    expect = list(fcfs)
    random.Random(7).shuffle(expect)                      # the policy's exact definition
    assert order(7) == order(7) == expect
    assert sorted(order(7)) == sorted(fcfs)
    assert {tuple(order(seed)) for seed in range(6)} != {tuple(expect)}   # seeds differ


def test_routing_key_hot_keys_first_then_most_common():
    s = make_scheduler(policy="routing-key")
    hot = Request("h0", toks(50_000, 8), 0, forced_output=toks(60_000, 9), routing_key="hot",
                  index=0)
    s.add(hot)
    plan = s.schedule(0.0)
    s.process(plan, StepResult([None], 0.01), 0.01)
    assert s.running == [hot]
    keys = ["a", "b", "a", None, "hot", "b", "a", "c"]
    for i, k in enumerate(keys, start=1):
        s.add(Request(f"w{i}-{k}", toks(10_000 * i, 8), 4, routing_key=k, arrival=float(i), index=i))
    assert [rid for rid, _ in admitted_order(s, 1.0)] == [
        "w5-hot",                                          # its key is running: KV is hot
        "w1-a", "w3-a", "w7-a",                            # 3 waiting share "a"
        "w2-b", "w6-b",                                    # 2 share "b"
        "w8-c",                                            # 1
        "w4-None",                                         # no key: last
    ]


X, Y, Y1 = toks(1000, 40), toks(2000, 40), toks(2100, 20)


def test_dfs_weight_groups_subtrees_heaviest_first():
    s = make_scheduler(policy="dfs-weight")
    warm(s, X)
    warm(s, Y + Y1)
    warm(s, Y + toks(2200, 10))                           # splits: Y is a node, Y1 its child
    specs = [
        ("x1", X + toks(5000, 5)),           # ends at node X
        ("y1", Y + toks(5100, 5)),           # ends at node Y (its own request)
        ("n1", toks(9000, 10)),              # matches nothing: root
        ("x2", X + toks(5200, 5)),           # X
        ("y2", Y + Y1 + toks(5300, 5)),      # Y/Y1
        ("y3", Y + Y1 + toks(5400, 5)),      # Y/Y1
    ]
    add_all(s, specs)
    # weights: Y subtree 3 (y1, y2, y3) before X's 2; inside Y, the deeper Y1 pair before y1
    # (post-order, as SGLang); n1 at the root comes last
    assert [rid for rid, _ in admitted_order(s)] == ["y2", "y3", "y1", "x1", "x2", "n1"]


def test_regression_dfs_weight_is_post_order():
    """dfs-weight used a pre-order walk: a node's own requests before its subtree's, so the
    requests with no cached prefix at all (at the root) were admitted first. SGLang's walk
    (and the docstring's claim) is post-order: deeper matches first, cold requests last."""
    s = make_scheduler(policy="dfs-weight")
    warm(s, X)
    add_all(s, [("cold", toks(9000, 10)), ("warm", X + toks(5000, 5))])
    assert [rid for rid, _ in admitted_order(s)] == ["warm", "cold"]


def test_dfs_weight_on_blockhash_is_fcfs():
    s = make_scheduler(policy="dfs-weight", kind="blockhash", page_size=4)
    add_all(s, [("a", toks(0, 9)), ("b", toks(100, 9))], arrival=[1.0, 0.0])
    assert [rid for rid, _ in admitted_order(s)] == ["b", "a"]


# ---- the match memo ------------------------------------------------------------------------

def count_pure_reads(s) -> list[int]:
    """Counts the cache's pure-read matches (the memo's recomputations) from now on."""
    cache, n = s.mgr.cache, [0]
    inner = cache.match_prefix

    def spy(key, split=True):
        n[0] += not split
        return inner(key, split)
    cache.match_prefix = spy
    return n


def test_match_memo_reuses_until_the_last_node_changes():
    s = make_scheduler(policy="lpm", max_running_requests=1)
    warm(s, X)
    a = Request("a", X + toks(7000, 6), 0, forced_output=toks(8000, 9), index=0)
    w1 = Request("w1", X + toks(5000, 10), 3, arrival=1.0, index=1)
    w2 = Request("w2", X + toks(6000, 10), 3, arrival=2.0, index=2)
    for r in (a, w1, w2):
        s.add(r)
    recomputed = count_pure_reads(s)

    def round_(now):
        plan = s.schedule(now)
        s.process(plan, StepResult([None] * len(plan.segments), 0.01), now)
        return plan

    plan = round_(0.0)                                   # sorts a, w1, w2: 3 fresh matches
    assert [seg.req.rid for seg in plan.extends] == ["a"]
    assert recomputed[0] == 3
    # a's prompt entered the tree under X (X's children changed): w1, w2 are asked again
    plan = round_(1.0)
    assert not plan.extends and [seg.req.rid for seg in plan.decodes] == ["a"]
    assert recomputed[0] == 5
    assert s.ctx.prefix(w1)[0] == 40 and s.ctx.prefix(w2)[0] == 40
    assert recomputed[0] == 5                            # both reused
    # a decode round changes no node: both memoized answers are reused
    round_(2.0)
    assert recomputed[0] == 5
    # an insert under X (the memoized last node of w1 and w2) invalidates both; w1 now
    # matches 5 more tokens
    warm(s, X + toks(5000, 5))
    assert s.ctx.prefix(w1)[0] == 45
    assert s.ctx.prefix(w2)[0] == 40
    assert recomputed[0] == 7
    assert s.ctx.prefix(w1)[0] == 45 and recomputed[0] == 7


def test_match_memo_recomputes_after_eviction_and_growth():
    s = make_scheduler(policy="lpm")
    warm(s, X)
    r = Request("r", X + toks(5000, 10), 3)
    recomputed = count_pure_reads(s)
    assert s.ctx.prefix(r)[0] == 40 and recomputed[0] == 1
    s.mgr.pool.free(s.mgr.cache.evict(10_000))           # X is gone
    assert s.ctx.prefix(r)[0] == 0 and recomputed[0] == 2
    r.tokens.append(1)                                    # a longer fill is a new question
    assert s.ctx.prefix(r)[0] == 0 and recomputed[0] == 3
    s.mgr.forget(r)
    assert s.ctx.prefix(r)[0] == 0 and recomputed[0] == 4
