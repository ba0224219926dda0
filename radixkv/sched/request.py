"""A request's state through waiting -> prefill (maybe chunked) -> running -> finished.

Token bookkeeping: `tokens` = prompt + output so far; `num_computed` tokens have KV in
`slots`. While running, len(tokens) == num_computed + 1: the last sampled token is fed by the
next decode step. A request that samples its stop token finishes with every token's KV
computed, so the next turn of a conversation can hit its whole reply.

The request is the shape the CacheManager needs (key, slots, cached_len,
last_node, priority): `key` covers exactly the tokens whose KV is computed.
"""
from __future__ import annotations

import enum
from typing import Any, Sequence

import numpy as np

from radixkv.cache.key import RadixKey, pack_tokens
from radixkv.cache.orders import reuse_signature
from radixkv.cache.pool import EMPTY_SLOTS, SLOT_DTYPE
from radixkv.argcheck import an_int, finite_at_least, finite_time, int_at_least, optional_str

STOP = -1          # the sentinel a scripted (workload-driven) request "samples" at its end
FILLER_BASE = 2**31   # output ids made up where a trace records only a length: above any vocabulary


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"        # admitted, KV of the fill not complete yet (chunked)
    RUNNING = "running"        # decoding
    FINISHED = "finished"
    ABORTED = "aborted"        # taken out before finishing (a client went away)


class SessionTurns:
    """Numbers each session's requests 0, 1, ... in the order `next` is asked."""

    def __init__(self):
        self._next: dict[str, int] = {}

    def next(self, session: str | None) -> int | None:
        if session is None:
            return None
        turn = self._next[session] = self._next.get(session, -1) + 1
        return turn


class Request:
    def __init__(self, rid: str, prompt: Sequence[int], max_new_tokens: int, arrival: float = 0.0,
                 forced_output: Sequence[int] | None = None, extra_key: str | None = None,
                 cache_salt: str | None = None, priority: int = 0, routing_key: str | None = None,
                 sampling: Any = None, stop_ids: Sequence[int] = (), index: int = 0,
                 pin_ttl: float = 0.0, session: str | None = None, turn: int | None = None):
        self.prompt_key = RadixKey(prompt, extra_key, cache_salt)    # validates the ids
        if len(self.prompt_key) == 0:
            raise ValueError(f"request {rid!r} has an empty prompt")
        if forced_output is not None:                         # same checks as the prompt's ids
            forced_output = tuple(memoryview(pack_tokens(forced_output)).cast("I"))
            max_new_tokens = len(forced_output) + 1           # the reply, then the stop
        arrival = finite_time(arrival, f"request {rid!r}: arrival")
        an_int(priority, f"request {rid!r}: priority")
        int_at_least(max_new_tokens, f"request {rid!r}: max_new_tokens", 1)
        self.rid, self.arrival, self.index = rid, arrival, index
        self.priority, self.routing_key, self.sampling = priority, routing_key, sampling
        self.pin_ttl = finite_at_least(pin_ttl, f"request {rid!r}: pin_ttl", 0)
        # the conversation it belongs to and its turn there (the engine counts a session's
        # arrivals when no turn is given): what the `reuse` eviction order learns from
        self.session = optional_str(session, f"request {rid!r}: session")
        self.turn = None if turn is None else int_at_least(turn, f"request {rid!r}: turn", 0)
        self.forced_output, self.max_new_tokens = forced_output, max_new_tokens
        self.stop_ids = frozenset(stop_ids) | {STOP}
        # a list/tuple is copied as is (fast); anything else (a one-shot iterator the key has
        # consumed, an array, a RadixKey) is read back from the validated key
        self.tokens: list[int] = (list(prompt) if isinstance(prompt, (list, tuple))
                                  else self.prompt_key.tokens)
        self.prompt_len = len(self.tokens)
        self.status = Status.WAITING
        self.num_computed = 0
        self._sbuf, self._ns = EMPTY_SLOTS, 0                 # slot buffer with spare capacity
        self.cached_len, self.last_node = 0, None              # the cache's share of `slots`
        self.host_loaded = 0                                   # of cached_len, from the host tier
        self._mkey: tuple[int, RadixKey] | None = None
        # metrics
        self.first_admit: float | None = None
        self.first_token: float | None = None
        self.finish_time: float | None = None
        self.cached_tokens = 0          # hit at first admission
        self.host_hit_tokens = 0        # of those, loaded from the host tier
        self.prefill_tokens = 0         # tokens computed by prefill (all admissions)
        self.recomputed_tokens = 0      # prefill after a retraction
        self.retractions = 0

    # ---- the cache's view -------------------------------------------------------------------
    @property
    def namespace(self) -> tuple:
        return self.prompt_key.namespace

    @property
    def key(self) -> RadixKey:
        """Tokens whose KV is computed, with the namespace."""
        n = self.num_computed
        if n <= self.prompt_len:
            return self.prompt_key[:n]
        return self.prompt_key + self.tokens[self.prompt_len:n]

    def match_key(self) -> RadixKey:
        """What admission matches: every token but the last (at least one is computed)."""
        n = len(self.tokens) - 1
        if self._mkey is None or self._mkey[0] != n:
            k = self.prompt_key[:n] if n <= self.prompt_len else self.prompt_key + self.tokens[self.prompt_len:n]
            self._mkey = (n, k)
        return self._mkey[1]

    @property
    def slots(self) -> np.ndarray:
        return self._sbuf[:self._ns]

    @slots.setter
    def slots(self, value) -> None:
        self._sbuf = np.asarray(value, dtype=SLOT_DTYPE).copy()
        self._ns = len(self._sbuf)

    def extend_slots(self, new: np.ndarray) -> None:
        need = self._ns + len(new)
        if need > len(self._sbuf):                            # grow geometrically
            buf = np.empty(max(need, 2 * len(self._sbuf), 64), dtype=SLOT_DTYPE)
            buf[:self._ns] = self._sbuf[:self._ns]
            self._sbuf = buf
        self._sbuf[self._ns:need] = new
        self._ns = need

    # ---- progress -----------------------------------------------------------------------------
    @property
    def reuse_tag(self) -> tuple:
        """The signature its inserts carry (cache/orders.py: the `reuse` order learns from
        it): its turn and the cached prefix of its first admission."""
        return reuse_signature(self.turn, self.cached_tokens)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_slots(self) -> int:
        """len(slots), without making the view."""
        return self._ns

    def head_slots(self, n: int) -> np.ndarray:
        """slots[:n] (n <= num_slots) in one view."""
        return self._sbuf[:n]

    @property
    def fill_len(self) -> int:
        """Tokens whose KV prefill must hold before the next sample."""
        return len(self.tokens)

    @property
    def remaining_decode(self) -> int:
        return max(self.max_new_tokens - len(self.tokens) + self.prompt_len, 0)

    def next_token(self, sampled: int | None) -> int:
        """The token this step produces: the script's when the request is scripted."""
        if self.forced_output is not None:
            i = len(self.tokens) - self.prompt_len
            return self.forced_output[i] if i < len(self.forced_output) else STOP
        if sampled is None:
            raise ValueError(f"request {self.rid!r} is not scripted and the executor sampled nothing")
        return int(sampled)

    def accept(self, token: int) -> bool:
        """Record a produced token; True when the request is finished."""
        if token in self.stop_ids:
            return True
        self.tokens.append(token)
        return len(self.tokens) - self.prompt_len >= self.max_new_tokens

    def __repr__(self) -> str:
        return (f"Request({self.rid!r}, {self.status.value}, prompt={self.prompt_len}, "
                f"out={len(self.output)}, computed={self.num_computed})")
