"""The closed-loop send order shared by the simulated clients (engine/clients.py) and the HTTP
load client (bench/client.py): N clients, each sending its next request when its previous one
is done, a conversation never split across clients nor sent ahead of its previous turn."""
from __future__ import annotations

import heapq
from collections import deque
from typing import Sequence

from radixkv.validate import positive_int


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
