"""KV events under pressure: a subscriber lagging past the PUB socket's high-water mark repairs
the gap through replay and ends exactly where the cache is; the replay buffer answers only its
last `buffer_steps` batches (an older start resyncs the index); `publish` never blocks the
engine thread, neither on a subscriber that reads nothing nor on a stalled sending thread (the
batches a full queue drops are counted on the server's /metrics, and the loss they leave shows
on the gateway's /metrics, per worker); vLLM 0.33's replay answers (topic frame first) are read."""
from __future__ import annotations

import contextlib
import threading
import uuid

import httpx
import zmq

from radixkv.gateway.core import EventSource, Routing
from radixkv.gateway.proxy import Gateway, build_gateway_app
from radixkv.gateway.tokens import Tokens
from radixkv.kvevents import publisher as publisher_module
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.publisher import KVEventsConfig, ZmqEventPublisher
from radixkv.kvevents.wire import END_SEQ, decode_batch, encode_batch, to_wire
from radixkv.server.launch import ServerThread
from tests.server._helpers import check_clean, client, metric, running_server, wait_idle
from tests.server.test_kv_events import PAGE, Driver, agrees, go_live, until

MODEL = "llama-3-8b"


def inproc() -> str:
    """An in-process endpoint: no kernel buffers, so the high-water marks alone bound a pipe."""
    return f"inproc://kv-pressure-{uuid.uuid4().hex}"


def reference(driver: Driver, seqs) -> KVIndex:
    """An index that received batches `seqs` (in order) of what the driver published."""
    ref = KVIndex()
    for seq in seqs:
        assert ref.apply_kv(seq, driver.published[seq], PAGE)
    return ref


def caught_up(index: KVIndex, seq: int) -> None:
    until(lambda: index.poll(20) >= 0 and index.last_seq >= seq, f"the index to reach seq {seq}")
    assert index.last_seq == seq


def same(index: KVIndex, ref: KVIndex) -> None:
    assert index.hashes() == ref.hashes()
    assert index.parents == ref.parents
    assert len(index) == len(ref)


@contextlib.contextmanager
def stalled_sender():
    """The publisher's sending thread blocks before encoding its next batch until released."""
    go = threading.Event()
    original = publisher_module.encode_batch
    entered = threading.Event()

    def wait_then_encode(*a, **kw):
        entered.set()
        go.wait(30)
        return original(*a, **kw)
    publisher_module.encode_batch = wait_then_encode
    try:
        yield entered, go
    finally:
        go.set()
        publisher_module.encode_batch = original


def test_a_subscriber_lagging_past_the_hwm_repairs_the_gap_by_replay_exactly():
    with ZmqEventPublisher(PAGE, inproc(), inproc(), buffer_steps=5000, hwm=2) as pub:
        driver = Driver("radix", pub, seed=11)
        with KVIndex.connect(pub.endpoint, pub.replay_endpoint) as index:
            index.catch_up()
            go_live(index, driver)
            gaps, replayed = index.gaps, index.replayed
            driver.run(1500)                    # not read: the pipe holds 2 + 1000 (SUB's HWM)
            until(lambda: pub.sent == len(driver.published), "the publisher to send")
            while index.poll(50):               # what the pipe kept, in order, then nothing
                pass
            before = index.last_seq
            assert (index.gaps, index.missed) == (gaps, 0)
            assert before < driver.last_seq     # the PUB socket dropped the rest silently
            driver.step()                       # the next live batch reveals the gap
            caught_up(index, driver.last_seq)
            assert (index.gaps, index.missed, index.resyncs) == (gaps + 1, 0, 0)
            # the replay brought every batch after `before`, the one that revealed the gap too
            assert index.replayed - replayed == driver.last_seq - before
            assert pub.dropped == 0
            same(index, reference(driver, range(len(driver.published))))
            assert index.hashes() == driver.cache.events().page_hashes()
            agrees(index, driver)
            assert driver.kinds == {"stored", "removed", "cleared"}


def replay_seqs(endpoint: str, start: int) -> list[int]:
    """The seqs a replay request from `start` returns, END_SEQ last."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        seqs = []
        while not seqs or seqs[-1] != END_SEQ:
            assert sock.poll(5000), f"no answer after {seqs}"
            empty, seq, payload = sock.recv_multipart()
            seqs.append(int.from_bytes(seq, "big", signed=True))
            assert empty == b"" and (payload == b"") == (seqs[-1] == END_SEQ)
            if seqs[-1] != END_SEQ:
                decode_batch(payload)
        return seqs
    finally:
        sock.close()


def test_the_replay_buffer_answers_only_its_last_buffer_steps_batches():
    with ZmqEventPublisher(PAGE, inproc(), inproc(), buffer_steps=5) as pub:
        driver = Driver("radix", pub, seed=12)
        while len(driver.published) < 40:
            driver.step()
        until(lambda: pub.sent == 40, "the publisher to send")
        assert pub._buffer.maxlen == 5 and len(pub._buffer) == 5       # memory: B batches
        assert replay_seqs(pub.replay_endpoint, 0) == [35, 36, 37, 38, 39, END_SEQ]
        assert replay_seqs(pub.replay_endpoint, 34) == [35, 36, 37, 38, 39, END_SEQ]
        assert replay_seqs(pub.replay_endpoint, 37) == [37, 38, 39, END_SEQ]
        assert replay_seqs(pub.replay_endpoint, 40) == [END_SEQ]       # nothing newer yet
        # a subscriber that asks from older than the buffer: 35 lost, the index resyncs and
        # holds exactly what the last 5 batches leave from nothing (pages the cache holds)
        with KVIndex.connect(pub.endpoint, pub.replay_endpoint) as index:
            assert index.catch_up() == 5
            assert (index.last_seq, index.missed, index.replayed, index.resyncs) == (39, 35, 5, 1)
            same(index, reference(driver, range(35, 40)))
            assert index.hashes() <= driver.cache.events().page_hashes()


def test_publish_never_waits_for_a_subscriber_that_reads_nothing():
    with ZmqEventPublisher(PAGE, "tcp://127.0.0.1:*", hwm=1) as pub:
        with KVIndex.connect(pub.endpoint) as index:
            driver = Driver("radix", pub, seed=13)
            go_live(index, driver)              # subscribed; from now on it reads nothing
            first = len(driver.published)
            steps = threading.Thread(target=lambda: driver.run(3000))
            steps.start()
            steps.join(60)
            assert not steps.is_alive(), "publish blocked the engine thread"
            until(lambda: pub.sent == len(driver.published), "the sending thread", timeout=30)
            assert pub.dropped == 0 and len(driver.published) - first > 2000


def test_a_full_queue_drops_counts_and_leaves_a_gap_no_replay_fills():
    with ZmqEventPublisher(PAGE, inproc(), inproc(), max_queue_size=2) as pub:
        driver = Driver("radix", pub, seed=14)
        with KVIndex.connect(pub.endpoint, pub.replay_endpoint) as index:
            index.catch_up()
            go_live(index, driver)
            live = driver.last_seq
            until(lambda: pub.sent == live + 1, "the publisher to send")
            assert pub.dropped == 0             # go_live steps slower than the thread sends
            with stalled_sender() as (entered, go):
                while len(driver.published) == live + 1:
                    driver.step()               # the sending thread takes it and stalls
                assert entered.wait(10)
                while len(driver.published) < live + 11:
                    driver.step()               # 1 in its hands, 2 queued, 7 dropped
                assert pub.dropped == 7
            dropped = set(range(live + 4, live + 11))
            until(lambda: pub.sent == live + 4, "the three batches it held")
            driver.step()                       # seq live+11 reveals the loss
            assert driver.last_seq == live + 11
            caught_up(index, live + 11)
            assert (index.missed, index.resyncs) == (7, 1)
            same(index, reference(driver, [live + 11]))
            assert index.hashes() <= driver.cache.events().page_hashes()
            assert replay_seqs(pub.replay_endpoint, live + 1) == [live + 1, live + 2, live + 3,
                                                                 live + 11, END_SEQ]
            assert not dropped & set(replay_seqs(pub.replay_endpoint, 0))


def test_the_engine_thread_never_blocks_on_a_stalled_publisher_and_drops_are_on_metrics():
    events = KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*", max_queue_size=1)
    with running_server(executor="sim", model=MODEL, kv_events=events) as (url, state):
        pub = state.worker.publisher
        assert metric(url, "radixkv_kv_events_dropped_total") == 0
        with stalled_sender() as (entered, go):
            c = client(url)
            for i in range(6):                  # each request stores pages: a batch or more
                r = c.completions.create(model=MODEL, prompt=f"pressure {i} " * 40, max_tokens=2)
                assert r.usage.completion_tokens == 2
            assert entered.is_set() and pub.dropped > 0
            assert metric(url, "radixkv_kv_events_dropped_total") == pub.dropped
        wait_idle(state)
        check_clean(state)


def test_the_gateway_shows_each_workers_lost_and_replayed_batches():
    with running_server(executor="sim", model=MODEL) as (wurl, _), \
            ZmqEventPublisher(PAGE, inproc(), inproc(), max_queue_size=2) as pub:
        driver = Driver("radix", pub, seed=15)
        for _ in range(3):                      # seqs 0-2, before the gateway comes, one by
            n = len(driver.published)           # one: the queue holds only 2
            while len(driver.published) == n:
                driver.step()
            until(lambda: pub.sent == n + 1, "the publisher to send")
        source = EventSource(pub.endpoint, pub.replay_endpoint)
        routing = Routing("round-robin", events={wurl: source})
        gw = Gateway([wurl], routing, Tokens(None))
        with ServerThread(build_gateway_app(gw)) as url:
            # the gateway numbers the batches it applies from 1
            until(lambda: routing.indexes and routing.indexes[0].last_seq == 3, "its catch-up")
            with stalled_sender() as (entered, go):
                while len(driver.published) < 4:
                    driver.step()               # seq 3: the sending thread takes it, stalls
                assert entered.wait(10)
                while len(driver.published) < 13:
                    driver.step()               # seqs 4, 5 queued; 6-12 dropped
                assert pub.dropped == 7
            until(lambda: pub.sent == 6, "the three batches it held")
            while len(driver.published) < 14:
                driver.step()                   # seq 13 reveals the loss
            until(lambda: routing.feeds[0].counts().batches == 3 + 3 + 2, "the loss")
            # batches: 3 replayed at start, 3 live, then an AllBlocksCleared and seq 13 (replayed)
            assert routing.feeds[0].counts() == (8, 1, 7, 4, 1, True)
            text = httpx.get(f"{url}/metrics").text
            assert f'radixkv_route_kv_events_caught_up{{worker="{wurl}"}} 1.0' in text
            for name, value in (("batches", 8), ("gaps", 1), ("missed", 7), ("replayed", 4),
                                ("resyncs", 1)):
                assert f'radixkv_route_kv_events_{name}_total{{worker="{wurl}"}} {value}.0' in text
            # the gateway forgot what it held at the loss: it holds what batch 13 stored
            assert routing.indexes[0].hashes() == reference(driver, [13]).hashes()
            assert routing.indexes[0].hashes() <= driver.cache.events().page_hashes()
            # regression: the feed's own index applied every batch too (a third copy); it
            # keeps the sequence only
            assert len(routing.feeds[0]._index) == 0 and routing.feeds[0]._index.parents == {}


def test_replay_answers_with_vllms_topic_frame_are_read():
    """vLLM 0.33's replay socket answers `[topic, seq, payload]` and ends with `[b"", -1, b""]`:
    a ROUTER answering so repairs the index as radixkv's own does."""
    with ZmqEventPublisher(PAGE, inproc()) as pub:
        driver = Driver("radix", pub, seed=16)
        while len(driver.published) < 4:
            driver.step()
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = inproc()
    router.bind(endpoint)
    try:
        with KVIndex.connect(inproc(), endpoint) as index:
            done = threading.Thread(target=lambda: index.catch_up(5000))
            done.start()
            assert router.poll(5000)
            client, empty, start = router.recv_multipart()
            assert int.from_bytes(start, "big") == 0
            for seq, events in enumerate(driver.published):
                router.send_multipart([client, empty, b"kv", seq.to_bytes(8, "big"),
                                       encode_batch(0.0, to_wire(events, PAGE))])
            router.send_multipart([client, empty, b"", END_SEQ.to_bytes(8, "big", signed=True),
                                   b""])
            done.join(10)
            assert (index.last_seq, index.replayed, index.missed) == (3, 4, 0)
            same(index, reference(driver, range(4)))
    finally:
        router.close()


def test_a_catch_up_skips_what_the_last_reset_in_it_wiped():
    """A new subscriber replays a history with cache resets in it: it holds exactly what a
    subscriber that applied everything holds, the batches before the last reset count as
    replayed without reaching the index one by one, and nothing counts as missed."""
    with ZmqEventPublisher(PAGE, inproc(), inproc(), buffer_steps=5000) as pub:
        driver = Driver("radix", pub, seed=5)
        driver.run(60)                                    # resets at steps 16, 33, 50
        until(lambda: pub.sent == len(driver.published), "the publisher to send")
        last = driver.last_seq
        clears = [s for s, evs in enumerate(driver.published)
                  if any(e.kind == "cleared" for e in evs)]
        assert len(clears) == 3
        with KVIndex.connect(pub.endpoint, pub.replay_endpoint) as index:
            seen = []
            step = index._step
            index._step = lambda seq, batch: seen.append(seq) or step(seq, batch)
            assert index.catch_up() == last + 1
            assert seen == list(range(clears[-1], last + 1))
            assert (index.last_seq, index.missed, index.replayed, index.resyncs) == \
                (last, 0, last + 1, 0)
            same(index, reference(driver, range(last + 1)))
            assert index.hashes() == driver.cache.events().page_hashes()
