"""The release rule of session arrivals (workloads/sessions.py): think times, which turn follows
which, and the queue of releases the cluster simulator runs on."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.workloads.sessions import ArrivalQueue, SessionArrivals, SessionChain


@pytest.mark.parametrize("text, want", [
    ("0", (0.0, False)), ("2.5", (2.5, False)), (" 10 ", (10.0, False)),
    ("exp:3", (3.0, True)), ("EXP:0.5", (0.5, True)), ("exp:0", (0.0, True)),
    ("1e-3", (0.001, False)),
])
def test_parse(text, want):
    a = SessionArrivals.parse(text, seed=4)
    assert (a.think_time, a.exponential, a.seed) == (*want, 4)


@pytest.mark.parametrize("text", ["", "-1", "inf", "nan", "exp:", "exp:-2", "exp:inf", "fast",
                                  "lognormal:3", "3s"])
def test_parse_refuses_with_the_value_named(text):
    with pytest.raises(ValueError) as e:
        SessionArrivals.parse(text)
    assert str(e.value) == (f"--think-time {text!r}: expected SECONDS (a finite number >= 0) "
                            f"or exp:SECONDS (exponential with that mean)")


@pytest.mark.parametrize("kw, match", [({"think_time": -1.0}, "think time must be"),
                                       ({"think_time": math.nan}, "think time must be"),
                                       ({"seed": -1}, "seed must be")])
def test_bad_fields_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SessionArrivals(**kw)


def test_draw_fixed_and_exponential():
    assert SessionArrivals(2.0).draw(3) == [2.0, 2.0, 2.0]
    assert SessionArrivals(0.0, exponential=True).draw(2) == [0.0, 0.0]
    a = SessionArrivals(5.0, exponential=True, seed=1).draw(2000)
    assert a == SessionArrivals(5.0, exponential=True, seed=1).draw(2000)
    assert a != SessionArrivals(5.0, exponential=True, seed=2).draw(2000)
    assert all(x >= 0 for x in a) and 4.5 < sum(a) / len(a) < 5.5
    # by trace position: a longer draw starts with the shorter one
    assert SessionArrivals(5.0, True, 1).draw(10) == a[:10]


def test_meta_and_describe():
    assert SessionArrivals(2.0).meta() == {"arrivals": "session", "think_time": 2.0,
                                           "think_time_distribution": "fixed"}
    assert SessionArrivals(3.0, True).describe() == "think time exp, mean 3 s"
    assert SessionArrivals(0.5).describe() == "think time 0.5 s"


def test_chain_by_hand():
    c = SessionChain(["a", None, "b", "a", None, "a", "b"], SessionArrivals(1.0))
    assert c.heads == [0, 1, 2, 4]
    assert c.successor == [3, None, 6, 5, None, None, None]
    assert c.release(0, 7.0) == (3, 8.0) and c.release(5, 9.0) is None


_SESSIONS = st.lists(st.sampled_from([None, "a", "b", "c", "d"]), max_size=30)


@settings(max_examples=200, deadline=None)
@given(sessions=_SESSIONS, think=st.sampled_from([0.0, 1.0]), exp=st.booleans())
def test_chain_matches_a_naive_scan(sessions, think, exp):
    c = SessionChain(sessions, SessionArrivals(think, exp, 3))
    for i, s in enumerate(sessions):
        prev = [j for j in range(i) if s is not None and sessions[j] == s]
        nxt = [j for j in range(i + 1, len(sessions)) if s is not None and sessions[j] == s]
        assert (i in c.heads) == (not prev)
        assert c.successor[i] == (nxt[0] if nxt else None)
    assert c.heads == sorted(c.heads)


@settings(max_examples=200, deadline=None)
@given(sessions=_SESSIONS, data=st.data())
def test_queue_releases_in_time_order_and_floor_bounds_what_is_left(sessions, data):
    """Drive the queue as a simulator does (pop the next, finish it some time later) and check
    every release against a naive reference, and the floor against the turns not released."""
    n = len(sessions)
    arrivals = sorted(data.draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)))
    spec = SessionArrivals(0.7, exponential=True, seed=data.draw(st.integers(0, 3)))
    chain = SessionChain(sessions, spec)
    q = ArrivalQueue(arrivals, chain)
    think = spec.draw(n)
    released: dict[int, float] = {}            # popped: position -> release time
    queued = set(chain.heads)                  # in the queue once, popped or not
    running: list[tuple[float, int]] = []      # (finish, position)
    while q or running:
        later = [j for j in range(n) if j not in queued]
        assert q.floor() == min((think[j] for j in later), default=math.inf)
        if running and (not q or min(running)[0] <= q.next_time()):
            running.sort()
            f, i = running.pop(0)
            t = q.finished(i, f)
            nxt = [j for j in range(i + 1, n) if sessions[i] is not None
                   and sessions[j] == sessions[i]]
            assert t == (f + think[nxt[0]] if nxt else None)
            queued.update(nxt[:1])
            continue
        i, t = q.pop()
        assert i not in released and all(t >= x for x in released.values())
        released[i] = t
        running.append((t + data.draw(st.floats(0, 3)), i))
    assert sorted(released) == list(range(n))
    for i in chain.heads:
        assert released[i] == arrivals[i]


def test_trace_arrivals_queue_is_the_sorted_trace():
    q = ArrivalQueue([0.0, 1.0, 1.0, 0.5])
    assert [q.pop() for _ in range(4)] == [(0, 0.0), (3, 0.5), (1, 1.0), (2, 1.0)]
    assert not q and q.next_time() == math.inf and q.floor() == math.inf
    assert q.finished(0, 9.0) is None


def test_floor_rises_as_turns_are_released():
    c = SessionChain(["a", "a", "a", "b", "b"], SessionArrivals(1.0))
    c.think = [0.0, 3.0, 1.0, 0.0, 2.0]
    q = ArrivalQueue([0.0] * 5, c)
    assert q.floor() == 1.0                        # turns 1, 2 and 4 are still to come
    assert q.finished(0, 1.0) == 4.0 and q.floor() == 1.0
    assert q.finished(1, 5.0) == 6.0 and q.floor() == 2.0
    assert q.finished(3, 0.5) == 2.5 and q.floor() == math.inf
    assert [q.pop() for _ in range(5)] == [(0, 0.0), (3, 0.0), (4, 2.5), (1, 4.0), (2, 6.0)]
