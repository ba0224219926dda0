"""Publishing the server's KV events: vLLM's `--kv-events-config` and its ZMQ publisher.

`KVEventsConfig` takes vLLM's JSON keys. `make_publisher` gives a `NullPublisher` (events are
computed, not sent) or a `ZmqEventPublisher`: the engine thread calls `publish(events)`, which
converts them to vLLM's wire events, numbers the batch and hands it to a sending thread through a
bounded queue; `publish` never blocks: a batch that finds the queue full is dropped, counted
(`dropped`) and logged, and its number is skipped, so every subscriber sees the loss as a
sequence gap that no replay can fill. The sending thread sends `[topic, 8-byte big-endian seq,
msgpack batch]` on a PUB socket, keeps the last `buffer_steps` batches, and answers replay
requests on a ROUTER socket: every buffered batch from the seq asked for, so a request older than
the buffer gets the buffer, as vLLM's does (kvevents/wire.py describes the wire format,
kvevents/index.py its subscriber, `KVIndex`).
"""
from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from itertools import count

import zmq

from radixkv.cache.events import KVEvent
from radixkv.kvevents.wire import END_SEQ, ENCODINGS, check_encoding, encode_batch, to_wire
from radixkv.argcheck import choice, int_at_least, optional_str, positive_int

log = logging.getLogger(__name__)
PUBLISHERS = ("null", "zmq")
_SCHEMES = ("tcp://", "ipc://", "inproc://")
_STOP = object()


def _endpoint(v, what: str) -> str:
    if not isinstance(v, str) or not v.startswith(_SCHEMES):
        raise ValueError(f"{what} must be a ZMQ address starting with "
                         f"{', '.join(_SCHEMES)}, got {v!r}")
    return v


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's KV events configuration; a TCP endpoint binds loopback unless told otherwise.
    `encoding` is radixkv's own key: "map" (vLLM's current tagged-map events, the default) or
    "array" (the older positional events that llm-d's adapter and Dynamo's docs read)."""
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    encoding: str = "map"

    def __post_init__(self):
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(f"KVEventsConfig.enable_kv_cache_events must be true or false, "
                             f"got {self.enable_kv_cache_events!r}")
        try:
            choice(self.publisher, "publisher", PUBLISHERS)
        except ValueError as e:
            raise ValueError(f"KVEventsConfig.publisher: {e}") from None
        _endpoint(self.endpoint, "KVEventsConfig.endpoint")
        if optional_str(self.replay_endpoint, "KVEventsConfig.replay_endpoint") is not None:
            _endpoint(self.replay_endpoint, "KVEventsConfig.replay_endpoint")
            free_port = self.endpoint.endswith((":0", ":*"))     # each socket gets its own
            if self.replay_endpoint == self.endpoint and not free_port:
                raise ValueError(f"KVEventsConfig.replay_endpoint equals endpoint {self.endpoint!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            positive_int(getattr(self, name), f"KVEventsConfig.{name}")
        if not isinstance(self.topic, str):
            raise ValueError(f"KVEventsConfig.topic must be a str, got {self.topic!r}")
        try:
            choice(self.encoding, "encoding", ENCODINGS)
        except ValueError as e:
            raise ValueError(f"KVEventsConfig.encoding: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse vLLM's JSON form, e.g. '{"enable_kv_cache_events": true, "publisher": "zmq"}'."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"KV events config is not valid JSON ({e}): {text!r}") from None
        if not isinstance(data, dict):
            raise ValueError(f"KV events config must be a JSON object, got {text!r}")
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise ValueError(f"unknown KV events config key {unknown[0]!r}; valid: {', '.join(valid)}")
        return cls(**data)


def offset_port(endpoint: str, dp_rank: int) -> str:
    """The endpoint of data-parallel rank `dp_rank`, as vLLM offsets it: a numbered TCP port
    plus the rank, an ipc/inproc name with a `_dp{rank}` suffix; a wildcard port stays."""
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        m = re.fullmatch(r"(tcp://.*):(\d+)", endpoint)
        return f"{m.group(1)}:{int(m.group(2)) + dp_rank}" if m and m.group(2) != "0" else endpoint
    return f"{endpoint}_dp{dp_rank}"


class NullPublisher:
    """Events are computed and dropped (enable_kv_cache_events with publisher "null")."""
    endpoint: str | None = None
    replay_endpoint: str | None = None
    dropped = 0

    def __init__(self) -> None:
        self._closed = False

    def publish(self, events: list[KVEvent]) -> None:
        if self._closed:
            raise RuntimeError("publish on a closed KV event publisher")

    def close(self) -> None:
        self._closed = True


class ZmqEventPublisher:
    """vLLM's PUB/ROUTER publisher: a sending thread, a bounded hand-off queue, a replay buffer.

    Both sockets bind (a `tcp://127.0.0.1:*` or port-0 endpoint takes a free port: read the
    `endpoint` and `replay_endpoint` properties). `publish` never blocks the engine thread: when
    the sending thread is `max_queue_size` batches behind, the batch is dropped and counted
    (vLLM's `put` blocks there instead). The PUB socket itself drops silently at `hwm` for a
    subscriber that lags; subscribers see both as sequence gaps.
    """
    SHUTDOWN_TIMEOUT_S = 5.0

    def __init__(self, block_size: int, endpoint: str = "tcp://127.0.0.1:5557",
                 replay_endpoint: str | None = None, buffer_steps: int = 10_000,
                 hwm: int = 100_000, max_queue_size: int = 100_000, topic: str = "",
                 dp_rank: int = 0, encoding: str = "map"):
        self.block_size = positive_int(block_size, "block_size")
        self.encoding = check_encoding(encoding)
        self.dp_rank = int_at_least(dp_rank, "dp_rank")
        if not isinstance(topic, str):
            raise ValueError(f"topic must be a str, got {topic!r}")
        self._topic = topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=positive_int(max_queue_size, "max_queue_size"))
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=positive_int(buffer_steps, "buffer_steps"))
        self._seq = count()
        self._sent = 0
        self._dropped = 0                       # batches refused by a full queue
        self._dropped_run = 0                   # of them since the last batch queued (one warning)
        self._lock = threading.Lock()           # publish vs close; numbering in order
        self._closed = False
        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, positive_int(hwm, "hwm"))
        self._pub.setsockopt(zmq.LINGER, 1000)  # what is queued at close still goes out
        self._replay: zmq.Socket | None = None
        try:
            self._endpoint = self._bind(self._pub, offset_port(_endpoint(endpoint, "endpoint"), dp_rank))
            self._replay_endpoint = None
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                # a whole buffer and its end marker must fit, or ROUTER drops the tail (as vLLM)
                self._replay.setsockopt(zmq.SNDHWM, 2 * (self._buffer.maxlen + 1))
                self._replay_endpoint = self._bind(
                    self._replay, offset_port(_endpoint(replay_endpoint, "replay_endpoint"), dp_rank))
        except BaseException:
            for s in (self._pub, self._replay):
                if s is not None:
                    s.close(linger=0)
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(sock: zmq.Socket, endpoint: str) -> str:
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot bind KV events socket to {endpoint!r}: {e}") from None
        return sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return self._replay_endpoint

    @property
    def sent(self) -> int:
        """The seq after the last batch sent (batches dropped before it included)."""
        return self._sent

    @property
    def dropped(self) -> int:
        """Batches dropped because the queue to the sending thread was full."""
        return self._dropped

    def publish(self, events: list[KVEvent]) -> None:
        """Number one step's events and hand them to the sending thread without waiting (nothing
        is sent for an empty list; a full queue drops the batch, its number skipped).
        Thread-safe; raises RuntimeError after close()."""
        wire = to_wire(events, self.block_size)     # a bad event raises here, at the caller
        with self._lock:
            if self._closed:
                raise RuntimeError("publish on a closed KV event publisher")
            if not self._thread.is_alive():
                raise RuntimeError("the KV events publisher thread has stopped (see the log)")
            if not wire:
                return
            seq = next(self._seq)
            try:
                self._queue.put_nowait((seq, time.time(), wire))
            except queue.Full:
                if self._dropped_run == 0:
                    log.warning("KV events queue full (%d batches): dropping batches from seq %d; "
                                "subscribers will see a gap", self._queue.maxsize, seq)
                self._dropped += 1
                self._dropped_run += 1
                return
            self._dropped_run = 0

    def close(self) -> None:
        """Send what is queued, stop the thread and close the sockets; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._queue.put(_STOP, timeout=self.SHUTDOWN_TIMEOUT_S)   # the thread is draining
        except queue.Full:
            log.warning("KV events queue still full after %.1f s at close", self.SHUTDOWN_TIMEOUT_S)
        self._thread.join(self.SHUTDOWN_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("KV events publisher thread still running after %.1f s",
                        self.SHUTDOWN_TIMEOUT_S)

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the sending thread (the only user of the sockets once started) ---------------------
    def _run(self) -> None:
        wait = 0.005 if self._replay is not None else 0.1     # replay requests wait at most this
        try:
            while True:
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._serve_replay()
                try:
                    item = self._queue.get(timeout=wait)
                except queue.Empty:
                    continue
                if item is _STOP:
                    break
                seq, ts, wire = item
                payload = encode_batch(ts, wire, self.dp_rank, self.encoding)
                self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
                self._buffer.append((seq, payload))
                self._sent = seq + 1
        except Exception:
            log.exception("KV events publisher thread failed; events are no longer sent")
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring a malformed KV events replay request of %d frames", len(frames))
            return
        client, empty, start = frames[0], frames[1], int.from_bytes(frames[2], "big")
        for seq, payload in self._buffer:
            if seq >= start:
                self._replay.send_multipart([client, empty, seq.to_bytes(8, "big"), payload])
        self._replay.send_multipart([client, empty, END_SEQ.to_bytes(8, "big", signed=True), b""])


def make_publisher(config: KVEventsConfig, block_size: int,
                   dp_rank: int = 0) -> NullPublisher | ZmqEventPublisher:
    """The publisher a configuration asks for: zmq only when events are enabled and sent."""
    if not config.enable_kv_cache_events or config.publisher == "null":
        return NullPublisher()
    return ZmqEventPublisher(block_size, config.endpoint, config.replay_endpoint,
                             config.buffer_steps, config.hwm, config.max_queue_size,
                             config.topic, dp_rank, config.encoding)
