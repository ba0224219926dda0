"""KV events end to end: a cache driven through requests, evictions and resets publishes every
step through a real ZmqEventPublisher on a free loopback port, and a KVIndex subscriber holds
exactly the cache's pages — after a lost message (a gap repaired by replay), as a late
subscriber, and for both caches; plus KVEventsConfig's JSON and the publisher's lifecycle."""
from __future__ import annotations

import random
import time

import msgspec
import pytest
import zmq

from radixkv.cache.base import CacheReq
from radixkv.cache.events import KVEvent
from radixkv.cache.manager import CacheManager
from radixkv.cache.pool import SlotPool
from radixkv.config import CacheConfig
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.hashes import page_hashes
from radixkv.kvevents.wire import encode_batch, to_wire
from radixkv.kvevents.publisher import (KVEventsConfig, NullPublisher, ZmqEventPublisher,
                                   make_publisher, offset_port)

from tests.cache._helpers import key

FREE = "tcp://127.0.0.1:*"
PAGE = 4


class Driver:
    """A cache served requests one at a time through a CacheManager (a small pool forces
    evictions; now and then a reset), publishing each step's events."""

    def __init__(self, kind: str, pub, seed: int = 0):
        self.cache = CacheConfig(kind=kind, page_size=PAGE, enable_events=True).build()
        self.mgr = CacheManager(self.cache, SlotPool(48, PAGE))
        self.pub, self.rng = pub, random.Random(seed)
        self.bases = [[self.rng.randrange(50) for _ in range(16)] for _ in range(3)]
        self.published: list[list[KVEvent]] = []      # by seq
        self.kinds: set[str] = set()

    def prompt(self) -> list[int]:
        base = self.rng.choice(self.bases)
        return base[:self.rng.randrange(4, 17)] + [self.rng.randrange(50) for _ in range(self.rng.randrange(8))]

    def step(self, reset: bool = False) -> None:
        if reset:
            self.mgr.reset()
        else:
            r = CacheReq(key(self.prompt()))
            assert self.mgr.admit(r, r.key, len(r.key)) is not None
            self.mgr.cache_req(r, finished=True)
        self.mgr.check()
        events = self.cache.events().take()
        self.kinds |= {e.kind for e in events}
        self.pub.publish(events)
        if events:
            self.published.append(events)

    def run(self, n: int) -> None:
        for i in range(n):
            self.step(reset=i % 17 == 16)

    @property
    def last_seq(self) -> int:
        return len(self.published) - 1


def until(cond, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def drain(index: KVIndex, seq: int, timeout: float = 5.0) -> None:
    """Poll until batch `seq` is applied, asking the replay socket when the live stream is quiet
    (a SUB socket misses what was sent before its subscription reached the publisher)."""
    deadline = time.monotonic() + timeout
    while index.last_seq < seq:
        assert time.monotonic() < deadline, f"index at seq {index.last_seq}, want {seq}"
        if index.poll(50) == 0 and index.last_seq < seq:
            index.catch_up()


def go_live(index: KVIndex, driver: Driver, tries: int = 200) -> None:
    """Step until a live message reaches the index (its subscription is in place), then apply it."""
    for _ in range(tries):
        driver.step()
        msg = index.receive(20)
        if msg is not None:
            index.handle(*msg)
            return
    raise AssertionError("no live message reached the subscriber")


def agrees(index: KVIndex, driver: Driver) -> None:
    cache = driver.cache
    assert index.hashes() == cache.events().page_hashes()
    for _ in range(20):                   # what a router computes: the cached prefix in pages
        p = driver.prompt()
        hit = cache.match_prefix(key(p), split=False).prefix_len
        assert index.prefix_match(page_hashes(p, (None, None), PAGE)) * PAGE == hit


@pytest.fixture
def publisher():
    pub = ZmqEventPublisher(PAGE, FREE, FREE)
    yield pub
    pub.close()


@pytest.mark.parametrize("kind", ["radix", "blockhash"])
def test_index_follows_the_cache_through_a_lost_message(publisher, kind):
    driver = Driver(kind, publisher, seed=1)
    with KVIndex.connect(publisher.endpoint, publisher.replay_endpoint) as index:
        index.catch_up()                                  # nothing published yet
        assert index.last_seq == -1 and len(index) == 0
        go_live(index, driver)
        driver.run(30)
        drain(index, driver.last_seq)
        agrees(index, driver)
        gaps = index.gaps                                 # 0, or 1 if it joined after a batch
        driver.step()
        lost = index.receive(2000)                        # taken off the wire, never applied
        while lost is not None and lost[0] <= index.last_seq:
            lost = index.receive(2000)                    # a live copy of a replayed batch
        assert lost is not None and lost[0] == driver.last_seq
        driver.step()
        until(lambda: index.poll(20) > 0, "the batch after the lost one")
        assert (index.last_seq, index.gaps, index.missed) == (driver.last_seq, gaps + 1, 0)
        driver.run(40)
        drain(index, driver.last_seq)
        agrees(index, driver)
        assert driver.kinds == {"stored", "removed", "cleared"} and len(index) > 0


@pytest.mark.parametrize("kind", ["radix", "blockhash"])
def test_late_subscriber_catches_up_by_replay_from_seq_0(publisher, kind):
    driver = Driver(kind, publisher, seed=2)
    driver.run(25)
    until(lambda: publisher.sent == len(driver.published), "the publisher to send")
    with KVIndex.connect(publisher.endpoint, publisher.replay_endpoint) as index:
        assert index.catch_up() == len(driver.published)
        assert (index.last_seq, index.gaps, index.missed) == (driver.last_seq, 0, 0)
        agrees(index, driver)
    with KVIndex.connect(publisher.endpoint, publisher.replay_endpoint) as late:
        go_live(late, driver)                             # its first live batch reveals the gap
        assert (late.last_seq, late.gaps, late.missed) == (driver.last_seq, 1, 0)
        agrees(late, driver)


def test_replay_buffer_keeps_the_last_buffer_steps_batches():
    with ZmqEventPublisher(PAGE, FREE, FREE, buffer_steps=3) as pub:
        driver = Driver("radix", pub, seed=3)
        driver.run(8)
        until(lambda: pub.sent == len(driver.published), "the publisher to send")
        with KVIndex.connect(pub.endpoint, pub.replay_endpoint) as index:
            assert index.catch_up() == 3
            assert (index.last_seq, index.missed) == (driver.last_seq, len(driver.published) - 3)


def test_frames_are_topic_seq_and_a_vllm_batch():
    with ZmqEventPublisher(PAGE, FREE, topic="kv", dp_rank=0) as pub:
        assert pub.replay_endpoint is None and pub.endpoint.startswith("tcp://127.0.0.1:")
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(pub.endpoint)
        driver = Driver("radix", pub, seed=4)
        try:
            for _ in range(200):
                driver.step()
                if sub.poll(20):
                    break
            topic, seq, payload = sub.recv_multipart()
        finally:
            sub.close()
        assert topic == b"kv" and len(seq) == 8
        events = driver.published[int.from_bytes(seq, "big")]
        ts, wire, rank = msgspec.msgpack.decode(payload)
        assert rank == 0 and abs(ts - time.time()) < 60
        assert payload == encode_batch(ts, to_wire(events, PAGE), 0)         # vLLM's tagged maps
        assert wire[0]["type"] in ("BlockStored", "BlockRemoved", "AllBlocksCleared")


def test_close_flushes_then_refuses_and_is_idempotent():
    pub = ZmqEventPublisher(PAGE, FREE)
    driver = Driver("radix", pub, seed=5)
    with KVIndex.connect(pub.endpoint) as index:
        go_live(index, driver)                            # no replay: what came before is missed
        missed = index.missed
        driver.run(10)
        pub.publish([])                                   # nothing is sent for an empty step
        pub.close()
        deadline = time.monotonic() + 5
        while index.last_seq < driver.last_seq and time.monotonic() < deadline:
            index.poll(50)
        assert (index.last_seq, index.missed) == (driver.last_seq, missed)
    assert pub.sent == len(driver.published)
    pub.close()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish([KVEvent("cleared")])


def test_bad_events_raise_at_the_caller():
    with ZmqEventPublisher(PAGE, FREE) as pub:
        with pytest.raises(ValueError, match="not block_size 4"):
            pub.publish([KVEvent("stored", 1, None, (1, 2))])
        assert pub.sent == 0


def test_make_publisher_follows_the_config():
    assert isinstance(make_publisher(KVEventsConfig(), PAGE), NullPublisher)
    null = make_publisher(KVEventsConfig(enable_kv_cache_events=True), PAGE)
    assert isinstance(null, NullPublisher) and null.endpoint is None
    null.publish([KVEvent("cleared")])
    null.close()
    null.close()
    cfg = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=FREE,
                         replay_endpoint="tcp://127.0.0.1:0")
    pub = make_publisher(cfg, PAGE)
    try:
        assert isinstance(pub, ZmqEventPublisher)
        ports = {pub.endpoint.rsplit(":", 1)[1], pub.replay_endpoint.rsplit(":", 1)[1]}
        assert len(ports) == 2 and "0" not in ports and "*" not in ports
    finally:
        pub.close()


def test_a_taken_port_is_named():
    with ZmqEventPublisher(PAGE, FREE) as pub:
        with pytest.raises(ValueError, match=f"cannot bind KV events socket to '{pub.endpoint}'"):
            ZmqEventPublisher(PAGE, pub.endpoint)


def test_dp_rank_offsets_the_port_as_vllm_does():
    assert offset_port("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_port("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_port("tcp://127.0.0.1:*", 2) == "tcp://127.0.0.1:*"
    assert offset_port("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"


# ---- KVEventsConfig ------------------------------------------------------------------------
def test_config_from_vllm_json():
    cfg = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "zmq", '
                                   '"endpoint": "tcp://127.0.0.1:6000", "topic": "kv", '
                                   '"replay_endpoint": "tcp://127.0.0.1:6001", "buffer_steps": 5}')
    assert cfg == KVEventsConfig(True, "zmq", "tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001",
                                 5, 100_000, 100_000, "kv")
    assert KVEventsConfig.from_json("{}") == KVEventsConfig()
    assert KVEventsConfig().endpoint == "tcp://127.0.0.1:5557"
    assert KVEventsConfig().encoding == "map"
    assert KVEventsConfig.from_json('{"encoding": "array"}').encoding == "array"


@pytest.mark.parametrize("kind", ["radix", "blockhash"])
def test_the_older_positional_encoding_on_request(kind):
    cfg = KVEventsConfig(True, "zmq", FREE, FREE, encoding="array")
    with make_publisher(cfg, PAGE) as pub:
        driver = Driver(kind, pub, seed=6)
        driver.run(25)
        until(lambda: pub.sent == len(driver.published), "the publisher to send")
        replay = zmq.Context.instance().socket(zmq.DEALER)
        replay.setsockopt(zmq.LINGER, 0)
        replay.connect(pub.replay_endpoint)
        try:
            replay.send_multipart([b"", (0).to_bytes(8, "big")])
            assert replay.poll(5000)
            _, seq, payload = replay.recv_multipart()
        finally:
            replay.close()
        ts, wire, rank = msgspec.msgpack.decode(payload)
        assert wire == [msgspec.msgpack.decode(msgspec.msgpack.encode(e))      # positional
                        for e in to_wire(driver.published[int.from_bytes(seq, "big")], PAGE)]
        assert all(isinstance(e, list) for e in wire) and rank == 0
        with KVIndex.connect(pub.endpoint, pub.replay_endpoint) as index:
            assert index.catch_up() == len(driver.published)
            agrees(index, driver)


@pytest.mark.parametrize("text, message", [
    ('{"enable_kv_cache_events": true,', "KV events config is not valid JSON"),
    ('[1, 2]', "KV events config must be a JSON object, got '\\[1, 2\\]'"),
    ('{"endpoints": "tcp://127.0.0.1:1"}',
     "unknown KV events config key 'endpoints'; valid: enable_kv_cache_events, publisher, "
     "endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic, encoding"),
    ('{"enable_kv_cache_events": "yes"}',
     "KVEventsConfig.enable_kv_cache_events must be true or false, got 'yes'"),
    ('{"publisher": "kafka"}', "KVEventsConfig.publisher: unknown publisher 'kafka'; valid: null, zmq"),
    ('{"endpoint": "127.0.0.1:5557"}', "KVEventsConfig.endpoint must be a ZMQ address"),
    ('{"replay_endpoint": 5558}', "KVEventsConfig.replay_endpoint must be a str or None, got 5558"),
    ('{"replay_endpoint": "tcp://127.0.0.1:5557"}', "replay_endpoint equals endpoint"),
    ('{"buffer_steps": 0}', "KVEventsConfig.buffer_steps must be a positive int, got 0"),
    ('{"hwm": "10"}', "KVEventsConfig.hwm must be a positive int, got '10'"),
    ('{"max_queue_size": true}', "KVEventsConfig.max_queue_size must be a positive int, got True"),
    ('{"topic": null}', "KVEventsConfig.topic must be a str, got None"),
    ('{"encoding": "json"}', "KVEventsConfig.encoding: unknown encoding 'json'; valid: map, array"),
])
def test_bad_config_json_names_the_key(text, message):
    with pytest.raises(ValueError, match=message):
        KVEventsConfig.from_json(text)
