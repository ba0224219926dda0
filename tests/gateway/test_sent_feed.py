"""SentFeed, the index of what the gateway sent a worker without KV events: each prompt's whole
pages stored for `ttl` seconds after they were last sent, told to the sink as BlockStored /
BlockRemoved batches. Against a plain reference (page hash -> expiry, expired when due), with
the index the sink builds checked after every step."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from radixkv.gateway.feeds import SentFeed
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.hashes import page_hashes
from radixkv.kvevents.wire import BlockRemoved, BlockStored

PAGE, TTL, NS = 2, 10.0, (None, None)
# prompts that share prefixes: a system prompt, two users on it, one turn on from the first
PROMPTS = [list(range(1, 9)), list(range(1, 9)) + [20, 21, 22, 23],
           list(range(1, 9)) + [30, 31, 32], list(range(1, 9)) + [20, 21, 22, 23, 24, 25],
           [7, 7, 7, 7, 7]]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pages_are_told_once_and_leave_ttl_after_they_were_last_sent():
    clock, batches = Clock(), []
    feed = SentFeed(PAGE, batches.append, TTL, clock)
    hashes = [page_hashes(p, NS, PAGE) for p in PROMPTS]
    feed.sent(PROMPTS[0], hashes[0])
    (stored,), = [b.events for b in batches]
    assert isinstance(stored, BlockStored) and stored.block_hashes == hashes[0]
    assert stored.parent_block_hash is None and stored.token_ids == PROMPTS[0]
    clock.now = 6.0
    feed.sent(PROMPTS[1], hashes[1])         # the shared pages refreshed, two new ones told
    new = batches[-1].events[0]
    assert new.block_hashes == hashes[1][4:] and new.parent_block_hash == hashes[0][-1]
    assert new.token_ids == PROMPTS[1][8:]
    clock.now = 12.0
    feed.expire()                            # sent at 6, due at 16: nothing leaves yet
    assert len(batches) == 2
    clock.now = 16.0
    feed.expire()
    assert batches[-1].events == [BlockRemoved(hashes[1], "GPU")]    # prefix first
    clock.now = 17.0
    feed.expire()
    assert len(batches) == 3                  # nothing left, nothing told


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, len(PROMPTS) - 1), st.sampled_from([0.0, 1.0, 4.0, 10.0])),
                max_size=30))
def test_against_a_reference_of_expiry_times(steps):
    clock, index, seq = Clock(), KVIndex(), [0]

    def sink(batch):
        seq[0] += 1
        index.apply(seq[0], batch)

    feed = SentFeed(PAGE, sink, TTL, clock)
    ref: dict[int, float] = {}
    for which, wait in steps:
        clock.now += wait
        hashes = page_hashes(PROMPTS[which], NS, PAGE)
        feed.sent(PROMPTS[which], hashes)
        ref = {h: t for h, t in ref.items() if t > clock.now}
        ref.update(dict.fromkeys(hashes, clock.now + TTL))
        assert dict(feed._expiry) == ref
        assert set(index.held_map) == set(ref)
        # the order kept is the order of expiry
        assert list(feed._expiry.values()) == sorted(feed._expiry.values())
    clock.now += TTL
    feed.expire()
    assert not feed._expiry and not index.held_map
