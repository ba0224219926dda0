"""A server's KV events, subscribed with radixkv.kvevents.wire.KVIndex, agree with its tree at the
end: through evictions and a flush, after a lost message (repaired by replay), and for a
subscriber that joins late."""
from __future__ import annotations

import time

import httpx
import pytest

from radixkv.config import CacheConfig
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.hashes import page_hashes
from radixkv.kvevents.publisher import KVEventsConfig
from tests.server._helpers import client, on_engine, running_server, wait_idle

EVENTS = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0",
                        topic="kv")


def agree(index: KVIndex, state, timeout: float = 10.0) -> set[int]:
    """Poll until the index holds exactly the tree's pages; returns them."""
    wait_idle(state)
    deadline = time.monotonic() + timeout
    while True:
        tree = on_engine(state, lambda e: e.cache.events().page_hashes())
        index.poll(50)
        if index.hashes() == tree:
            return tree
        if time.monotonic() > deadline:
            index.catch_up(1000)
            assert index.hashes() == tree, (len(index.hashes()), len(tree))
            return tree


def send(url: str, prompts) -> None:
    c = client(url)
    for p in prompts:
        c.completions.create(model="llama-3-8b", prompt=p, max_tokens=3)


@pytest.mark.parametrize("cache", [CacheConfig(kind="radix", page_size=4),
                                   CacheConfig(kind="blockhash", page_size=16)],
                         ids=["radix-p4", "blockhash-b16"])
def test_index_agrees_with_the_tree_through_loss_eviction_and_flush(cache):
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=2048, cache=cache,
                        kv_events=EVENTS) as (url, state):
        ev = state.info["kv_events"]
        with KVIndex.connect(ev["endpoint"], ev["replay_endpoint"], topic="kv") as index:
            system = list(range(5000, 5400))
            send(url, [system + [i, i + 1, i + 2] * 10 for i in range(3)])
            held = agree(index, state)
            assert len(held) > 0
            # the prompt's whole pages are held under the hashes a router would compute
            ns = (None, None)
            want = page_hashes(system + [0, 1, 2] * 10, ns, cache.page_size)
            assert len(want) == 430 // cache.page_size and index.prefix_match(want) == len(want)
            # lose one message on purpose, then more traffic: the gap is repaired by replay
            send(url, [list(range(9000, 9300))])
            wait_idle(state)
            lost = index.receive(5000)
            assert lost is not None
            gaps = index.gaps
            send(url, [list(range(7000 + 500 * k, 7400 + 500 * k)) for k in range(4)])  # evicts
            agree(index, state)
            assert index.gaps > gaps
            assert on_engine(state, lambda e: e.manager.evicted_tokens) > 0
            # a flush clears the index too
            assert httpx.post(f"{url}/flush_cache").status_code == 200
            assert agree(index, state) == set()
            send(url, [system + [1, 2, 3]])
            agree(index, state)
        # a late subscriber catches up by replay from the start
        with KVIndex.connect(ev["endpoint"], ev["replay_endpoint"], topic="kv") as late:
            late.catch_up(2000)
            assert late.hashes() == on_engine(state, lambda e: e.cache.events().page_hashes())


def test_tenants_hash_apart():
    """The same tokens under two namespaces are two sets of pages on the wire."""
    a = page_hashes(list(range(64)), (None, "tenant:alpha"), 16)
    b = page_hashes(list(range(64)), (None, "tenant:beta"), 16)
    assert len(a) == len(b) == 4 and not set(a) & set(b)
