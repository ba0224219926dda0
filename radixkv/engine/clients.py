"""Closed-loop load: N clients, each sending its next request the moment its previous one
finishes (think time 0), instead of the trace's arrival times.

Which request a client sends next: the earliest request in trace order that it may send, that
is one of a session it already holds or the first request of a session nobody holds yet (the
session then becomes the client's). So every session stays on one client, in its trace order,
and each client's requests are in trace order. A multi-turn conversation is therefore never
sent ahead of its previous turn's reply, which its prompt contains. A request without a
session is a session of its own. A client left with nothing it may send stays idle: the
sessions still pending belong to other clients.
"""
from __future__ import annotations

from typing import Sequence

from radixkv.sched.request import Request
from radixkv.validate import positive_int
from radixkv.workloads.sessions import SessionQueue


class ClosedLoop:
    """Feeds an Engine: `start(engine)` sends each client's first request at the engine's
    current time; the engine's on_finish hook (`finished`) sends the finishing client's next
    one. `requests` are in trace order; `sessions[i]` is request i's session or None."""

    def __init__(self, requests: Sequence[Request], sessions: Sequence[str | None],
                 num_clients: int):
        if len(sessions) != len(requests):
            raise ValueError(f"{len(sessions)} sessions for {len(requests)} requests")
        self.num_clients = positive_int(num_clients, "the number of clients")
        self.requests = list(requests)
        self._order = SessionQueue(sessions, self.num_clients)
        self._pos = {id(r): i for i, r in enumerate(self.requests)}   # rids may repeat
        self.client_of: list[int | None] = [None] * len(self.requests)  # by trace position
        self.sent: list[list[Request]] = [[] for _ in range(self.num_clients)]
        self._engine = None

    def start(self, engine) -> None:
        """Check every request fits the engine's pool (so a run cannot stop halfway on one
        that never could), then send each client's first request."""
        for r in self.requests:
            engine.check_fits(r)
        self._engine = engine
        for c in range(self.num_clients):
            self._send(c, engine.now)

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
