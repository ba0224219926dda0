"""What a live front end (Ray Serve's request router, `radixkv route`) knows of the requests it
routed and that have not finished, per replica, and the `ReplicaView`s it routes on.

A replica's view is what the front end knows at once plus what the replica last reported, as
in the cluster simulator: the requests routed to it and not finished (waiting = those − the
running it reports), their prompt tokens not prefilled yet (until their first output) and their
output budgets; running and KV slots used from the replica's own figures.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from radixkv.router.base import ReplicaView, RequestInfo


class InFlight:
    def __init__(self, n: int):
        self.n = n
        self.infos: dict[str, tuple[int, RequestInfo]] = {}      # routed, not finished
        self.prefilling: set[str] = set()
        self.held = [0] * n
        self.unprefilled = [0] * n
        self.budget = [0] * n

    def sent(self, i: int, info: RequestInfo) -> None:
        self.infos[info.rid] = (i, info)
        self.prefilling.add(info.rid)
        self.held[i] += 1
        self.unprefilled[i] += info.prompt_len
        self.budget[i] += info.max_new_tokens

    def first_output(self, rid: str) -> tuple[int, RequestInfo] | None:
        """`rid`'s prompt stops counting as unprefilled; its (replica, info) the first time."""
        if rid not in self.prefilling:
            return None
        self.prefilling.discard(rid)
        i, info = self.infos[rid]
        self.unprefilled[i] -= info.prompt_len
        return i, info

    def finished(self, rid: str) -> tuple[int, RequestInfo] | None:
        """`rid` is done (or abandoned): its (replica, info), or None if it was not in flight."""
        if rid not in self.infos:
            return None
        self.first_output(rid)
        i, info = self.infos.pop(rid)
        self.held[i] -= 1
        self.budget[i] -= info.max_new_tokens
        return i, info

    def on(self, i: int) -> list[str]:
        """The requests in flight on replica `i`."""
        return [rid for rid, (j, _) in self.infos.items() if j == i]

    def views(self, figures: Sequence[Mapping]) -> list[ReplicaView]:
        """One view per replica; `figures[i]` is what replica i last reported (running,
        kv_used, kv_capacity; missing keys count 0)."""
        out = []
        for i in range(self.n):
            f = figures[i]
            running = min(f.get("running", 0), self.held[i])
            out.append(ReplicaView(self.held[i] - running, running, self.unprefilled[i],
                                   self.budget[i], f.get("kv_used", 0), f.get("kv_capacity", 0)))
        return out
