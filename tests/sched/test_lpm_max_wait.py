"""--lpm-max-wait: requests that waited longer than it are admitted before the lpm order, fcfs
among them; younger ones keep the lpm order behind them."""
from __future__ import annotations

import pytest

from radixkv.config import SchedulerConfig
from radixkv.sched.request import Request
from tests.sched._helpers import admitted_order, make_scheduler, toks, warm


def queue(policy: str, max_wait: float):
    s = make_scheduler(policy=policy, lpm_max_wait=max_wait, max_running_requests=4)
    warm(s, toks(0, 100))
    # cold requests arrived first; warm ones (100 cached tokens) later
    for i, (arrival, start) in enumerate([(0.0, 5000), (1.0, 6000), (8.0, 0), (9.0, 0)]):
        prompt = toks(start, 100) + toks(9000 + 50 * i, 20)
        s.add(Request(f"r{i}", prompt, 4, arrival=arrival, index=i))
    return s


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_overdue_requests_go_first_in_arrival_order(policy):
    s = queue(policy, max_wait=6.0)
    assert [rid for rid, _ in admitted_order(s, now=10.0)] == ["r0", "r1", "r2", "r3"]
    assert s.counters.overdue == 2


def test_without_overdue_requests_lpm_order_holds():
    assert [rid for rid, _ in admitted_order(queue("lpm", 6.0), now=5.0)] == ["r2", "r3", "r0", "r1"]
    assert [rid for rid, _ in admitted_order(queue("lpm", 0.0), now=10.0)] == ["r2", "r3", "r0", "r1"]


def test_a_negative_max_wait_is_refused_by_name():
    with pytest.raises(ValueError, match="lpm_max_wait"):
        SchedulerConfig(lpm_max_wait=-1.0)


@pytest.mark.parametrize("policy, first", [("lpm", "long"), ("fcfs", "short")])
def test_queue_aware_eviction_ranks_by_the_order_the_queue_is_served_in(policy, first):
    # the guard's rank is the position of a prefix's first waiter in this round's order
    from radixkv.cache.key import RadixKey
    s = make_scheduler(policy=policy, max_running_requests=4)
    warm(s, toks(0, 50))                           # short
    warm(s, toks(1000, 100))                       # long
    s.add(Request("short", toks(0, 50) + toks(5000, 20), 4, arrival=0.0, index=0))
    s.add(Request("long", toks(1000, 100) + toks(6000, 20), 4, arrival=1.0, index=1))
    s.schedule(2.0)
    rank = {name: s.mgr._kept_rank(s.mgr.peek(RadixKey(t)).last_node)
            for name, t in (("short", toks(0, 50)), ("long", toks(1000, 100)))}
    assert rank[first] == 0 and sorted(rank.values()) == [0, 1]
