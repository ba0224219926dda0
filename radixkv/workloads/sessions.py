"""The closed-loop send order shared by the simulated clients (engine/clients.py) and the HTTP
load client (bench/client.py): N clients, each sending its next request when its previous one
is done, a conversation never split across clients nor sent ahead of its previous turn.

And session arrivals, open loop, shared by the simulator (engine/clients.py), the cluster
simulator (router/cluster.py) and the load client: each later turn of a session is released a
think time after its predecessor's reply finished (`SessionArrivals`, `SessionChain`,
`ArrivalQueue`)."""
from __future__ import annotations

import heapq
import math
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from radixkv.argcheck import finite_at_least, int_at_least, positive_int


class SessionQueue:
    """`take(client)` gives the trace position of the client's next request: the earliest in
    trace order of a session it holds, or of a session nobody holds yet (which becomes its
    own); None when it may send nothing more (the sessions left belong to other clients). A
    request without a session is a session of its own."""

    def __init__(self, sessions: Sequence[str | None], num_clients: int):
        positive_int(num_clients, "the number of clients")
        self._queues: dict[object, deque[int]] = {}
        for i, s in enumerate(sessions):
            # a sessionless request is keyed by its position, which no session name (a str)
            # can equal
            self._queues.setdefault(i if s is None else s, deque()).append(i)
        # sessions by their first request: a client taking a new session always takes the
        # earliest one, so the unheld sessions are handed out in this order
        self._unheld = deque(sorted(self._queues, key=lambda k: self._queues[k][0]))
        self._held: list[list[tuple[int, object]]] = [[] for _ in range(num_clients)]

    def take(self, client: int) -> int | None:
        held = self._held[client]
        new = self._queues[self._unheld[0]][0] if self._unheld else None
        if held and (new is None or held[0][0] < new):
            _, session = heapq.heappop(held)
        elif new is not None:
            session = self._unheld.popleft()
        else:
            return None
        q = self._queues[session]
        i = q.popleft()
        if q:
            heapq.heappush(held, (q[0], session))
        return i

    def pending(self) -> int:
        """Requests not taken yet."""
        return sum(len(q) for q in self._queues.values())


# ---- session arrivals: each later turn released a think time after its predecessor finished --
ARRIVAL_MODES = ("trace", "session")


@dataclass(frozen=True)
class SessionArrivals:
    """Open loop with sessions: a session's first turn (and a request without a session)
    arrives at its trace arrival; each later turn `think_time` seconds after the previous turn
    of its session (trace order) finished. `exponential`: each turn's think time is drawn
    exponential with mean `think_time`, per trace position from `seed`, so every configuration
    of a comparison waits the same for the same turn."""
    think_time: float = 0.0
    exponential: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "think_time", finite_at_least(self.think_time, "think time"))
        object.__setattr__(self, "seed", int_at_least(self.seed, "seed", 0))

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> SessionArrivals:
        """'5' (fixed) or 'exp:5' (exponential, mean 5), in seconds, as --think-time takes it."""
        body = text.strip()
        exponential = body.lower().startswith("exp:")
        number = body[4:] if exponential else body
        try:
            value = float(number)
            if not math.isfinite(value) or value < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"--think-time {text!r}: expected SECONDS (a finite number >= 0) "
                             f"or exp:SECONDS (exponential with that mean)") from None
        return cls(value, exponential, seed)

    def draw(self, n: int) -> list[float]:
        """The think time before each of n requests, by trace position."""
        if not self.exponential or self.think_time == 0:
            return [self.think_time] * n
        ss = np.random.SeedSequence([self.seed, zlib.crc32(b"think-time")])
        return np.random.default_rng(ss).exponential(self.think_time, n).tolist()

    def describe(self) -> str:
        """"think time 5 s" or "think time exp, mean 5 s"."""
        return f"think time {'exp, mean ' if self.exponential else ''}{self.think_time:g} s"

    def meta(self) -> dict:
        """What a run's JSON records of it."""
        return {"arrivals": "session", "think_time": self.think_time,
                "think_time_distribution": "exponential" if self.exponential else "fixed"}


class SessionChain:
    """Which turn follows which: `heads` are the trace positions released at their own
    arrival (each session's first request, every request without a session), in trace order;
    `successor[i]` is the next request of i's session in trace order (None: the last), released
    `think[successor]` seconds after i finished."""

    def __init__(self, sessions: Sequence[str | None], arrivals: SessionArrivals):
        n = len(sessions)
        self.think = arrivals.draw(n)
        self.successor: list[int | None] = [None] * n
        self.heads: list[int] = []
        last: dict[str, int] = {}
        for i, s in enumerate(sessions):
            if s is not None and s in last:
                self.successor[last[s]] = i
            else:
                self.heads.append(i)
            if s is not None:
                last[s] = i

    def release(self, i: int, finish: float) -> tuple[int, float] | None:
        """(the request following i, its release time) once i finished at `finish`."""
        j = self.successor[i]
        return None if j is None else (j, finish + self.think[j])


class ArrivalQueue:
    """Requests by release time, ties in trace order: every request at its arrival (trace
    arrivals, `chain` None), or the heads at theirs and each later turn when `finished` reports
    its predecessor done. `floor()` is a bound below every think time still to come: no release
    lands sooner than that after a finish reported later (what lets the cluster simulator run
    a replica ahead of the clock)."""

    def __init__(self, arrivals: Sequence[float], chain: SessionChain | None = None):
        self.chain = chain
        heads = range(len(arrivals)) if chain is None else chain.heads
        self._due = [(arrivals[i], i) for i in heads]
        heapq.heapify(self._due)
        # the successors by think time; a released one is skipped when it reaches the front
        later = [] if chain is None else [j for j in chain.successor if j is not None]
        self._thinks = sorted(later, key=lambda j: (chain.think[j], j), reverse=True)
        self._released: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._due)

    def next_time(self) -> float:
        return self._due[0][0] if self._due else math.inf

    def pop(self) -> tuple[int, float]:
        """(trace position, release time) of the next request."""
        t, i = heapq.heappop(self._due)
        return i, t

    def finished(self, i: int, finish: float) -> float | None:
        """Request i finished at `finish`: queue its successor; its release time, or None."""
        if self.chain is None:
            return None
        nxt = self.chain.release(i, finish)
        if nxt is None:
            return None
        j, t = nxt
        heapq.heappush(self._due, (t, j))
        self._released.add(j)
        return t

    def floor(self) -> float:
        """The least think time of a turn not released yet (inf: none is left)."""
        while self._thinks and self._thinks[-1] in self._released:
            self._thinks.pop()
        return self.chain.think[self._thinks[-1]] if self._thinks else math.inf
