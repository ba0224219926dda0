"""Load that follows the replies: the engine's on_finish hook sends what a finish allows.

`ClosedLoop` — N clients, each sending its next request the moment its previous one finishes
(think time 0), instead of the trace's arrival times. `SessionLoop` — open loop with sessions
(`--arrivals session`): each session's first turn at its trace arrival, each later turn a
think time after its previous turn finished (workloads/sessions.py's `SessionChain`, which
the cluster simulator and bench-serve share).

Closed loop, which request a client sends next: the earliest request in trace order that it
may send, that is one of a session it already holds or the first request of a session nobody
holds yet (the session then becomes the client's). So every session stays on one client, in
its trace order, and each client's requests are in trace order. A multi-turn conversation is therefore never
sent ahead of its previous turn's reply, which its prompt contains. A request without a
session is a session of its own. A client left with nothing it may send stays idle: the
sessions still pending belong to other clients.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from radixkv.sched.request import Request
from radixkv.argcheck import positive_int
from radixkv.workloads.sessions import SessionArrivals, SessionChain, SessionQueue


class _Feed(ABC):
    """Requests in trace order (`sessions[i]`: request i's session or None) fed to an Engine:
    `start(engine)` checks every request fits its pool (so a run cannot stop halfway on one
    that never could) and sends the first ones; `finished`, the engine's on_finish hook, sends
    what that finish allows."""

    def __init__(self, requests: Sequence[Request], sessions: Sequence[str | None]):
        if len(sessions) != len(requests):
            raise ValueError(f"{len(sessions)} sessions for {len(requests)} requests")
        self.requests = list(requests)
        self._pos = {id(r): i for i, r in enumerate(self.requests)}   # rids may repeat
        self._engine = None

    def start(self, engine) -> None:
        for r in self.requests:
            engine.check_fits(r)
        self._engine = engine
        self._first(engine.now)

    @abstractmethod
    def _first(self, now: float) -> None:
        """Send the requests that may go at the start (at `now`)."""

    @abstractmethod
    def finished(self, req: Request) -> None:
        """The engine's on_finish hook: send what `req`'s finish allows."""


class ClosedLoop(_Feed):
    """`start(engine)` sends each client's first request at the engine's current time; the
    engine's on_finish hook (`finished`) sends the finishing client's next one."""

    def __init__(self, requests: Sequence[Request], sessions: Sequence[str | None],
                 num_clients: int):
        super().__init__(requests, sessions)
        self.num_clients = positive_int(num_clients, "the number of clients")
        self._order = SessionQueue(sessions, self.num_clients)
        self.client_of: list[int | None] = [None] * len(self.requests)  # by trace position
        self.sent: list[list[Request]] = [[] for _ in range(self.num_clients)]

    def _first(self, now: float) -> None:
        for c in range(self.num_clients):
            self._send(c, now)

    def finished(self, req: Request) -> None:
        self._send(self.client_of[self._pos[id(req)]], req.finish_time)

    def pending(self) -> int:
        """Requests not sent yet."""
        return self._order.pending()

    def _send(self, client: int, now: float) -> None:
        i = self._order.take(client)
        if i is None:
            return
        req = self.requests[i]
        req.arrival = now                 # TTFT and E2E count from the moment it is sent
        self.client_of[i] = client
        self.sent[client].append(req)
        self._engine.add_request(req)


class SessionLoop(_Feed):
    """Session arrivals: the heads (each session's first request, every request without a
    session) at their own arrival times; each later turn, when its predecessor finishes, at
    finish + think time (its arrival set to that, so TTFT and E2E count from its release)."""

    def __init__(self, requests: Sequence[Request], sessions: Sequence[str | None],
                 arrivals: SessionArrivals):
        super().__init__(requests, sessions)
        self.chain = SessionChain(sessions, arrivals)
        self.released = 0                 # later turns sent so far

    def _first(self, now: float) -> None:
        for i in self.chain.heads:
            self._engine.add_request(self.requests[i])

    def finished(self, req: Request) -> None:
        nxt = self.chain.release(self._pos[id(req)], req.finish_time)
        if nxt is not None:
            j, t = nxt
            self.requests[j].arrival = t
            self.released += 1
            self._engine.add_request(self.requests[j])

    def pending(self) -> int:
        """Requests not sent yet."""
        sent = len(self.chain.heads) + self.released if self._engine is not None else 0
        return len(self.requests) - sent
