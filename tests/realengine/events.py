"""A subscriber of one vLLM worker's KV events, decoding its batches with plain msgspec (no vLLM
import), as a gateway in front of vLLM would.

The wire, as vLLM 0.32 sends it: each PUB message is three frames (topic, the batch's sequence
number as 8 bytes big-endian, the msgpack batch). A batch is an array [ts, events,
data_parallel_rank]; each event a map tagged by its "type" (BlockStored, BlockRemoved,
AllBlocksCleared), block hashes as ints (the low 64 bits of vLLM's digests). The replay endpoint
(a ROUTER) answers a request [b"", start seq] with every buffered batch from that seq on, as
[b"", topic, seq, batch] each, then [b"", b"", -1, b""]."""
from __future__ import annotations

import threading
import time
from typing import Callable

import msgspec
import zmq

END_SEQ = -1


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


_decode = msgspec.msgpack.Decoder(Batch).decode


class Subscriber:
    """Collects every batch a worker publishes from when it is made, keyed by sequence number,
    in a thread of its own; `close()` ends it."""

    def __init__(self, endpoint: str, topic: str, settle: float = 0.5):
        self.endpoint = endpoint
        self.topic = topic
        self.batches: dict[int, Batch] = {}
        self.error: Exception | None = None
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        sub.connect(endpoint)
        self._thread = threading.Thread(target=self._run, args=(sub,), daemon=True,
                                        name=f"kv-events {endpoint}")
        self._thread.start()
        # a SUB's subscription reaches the PUB a moment after connecting: what is published
        # before then is lost (the replay endpoint has it)
        time.sleep(settle)

    def _run(self, sub: zmq.Socket) -> None:
        try:
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                _topic, seq, payload = sub.recv_multipart()
                batch = _decode(payload)
                with self._lock:
                    self.batches[int.from_bytes(seq, "big")] = batch
                    self._lock.notify_all()
        except (zmq.ZMQError, msgspec.DecodeError, ValueError) as e:
            # a batch that does not decode ends the thread: wait() reports it
            with self._lock:
                self.error = e
                self._lock.notify_all()
        finally:
            sub.close()

    def last_seq(self) -> int:
        """The highest sequence number received so far (-1 before any)."""
        with self._lock:
            return max(self.batches, default=-1)

    def events_after(self, seq: int) -> list[Event]:
        """The events of the batches numbered above `seq`, in order."""
        with self._lock:
            return [e for s in sorted(self.batches) if s > seq for e in self.batches[s].events]

    def wait(self, done: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until `done()` (called under the lock at each batch) holds; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done():
                if self.error is not None:
                    raise AssertionError(f"the subscriber of {self.endpoint} stopped: "
                                         f"{self.error!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ctx.term()


def replay(endpoint: str, start: int = 0, timeout: float = 10.0) -> dict[int, Batch]:
    """Every batch the worker still buffers from sequence number `start` on, from its replay
    endpoint."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out: dict[int, Batch] = {}
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000)):
                raise TimeoutError(f"no end of replay from {endpoint} in {timeout} s")
            _, _topic, seq, payload = sock.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == END_SEQ:
                return out
            out[n] = _decode(payload)
    finally:
        sock.close()
        ctx.term()
