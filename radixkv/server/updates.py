"""A request's updates on their way from the engine thread to its HTTP response, bounded.

The engine thread delivers an update per step; the response takes them as fast as its client
reads. A client that stops reading would let them pile up without end, so once
`MAX_PENDING_UPDATES - 1` wait the request is aborted on the engine (its slots and lock are
freed before the next step) and later updates are dropped, except the last one (the abort's,
or the finish that beat it), which is still queued: at most MAX_PENDING_UPDATES ever wait, and
a reader that comes back sees a prefix of the output, then the end.

`ClosingStreamingResponse` closes its generator however the response ends: a send that failed
(a client dropped for not reading, server/guard.py) leaves it suspended at a `yield`, and
without the close its `finally` (which aborts the request) would wait for the garbage collector.
"""
from __future__ import annotations

import asyncio
import logging

from fastapi.responses import StreamingResponse

from radixkv.sched.request import Request
from radixkv.server.worker import EngineWorker, Update

log = logging.getLogger(__name__)
MAX_PENDING_UPDATES = 4096      # about 0.6 MB of SSE chunks; minutes of output at 30 tokens/s


class UpdateQueue:
    def __init__(self, worker: EngineWorker, req: Request, loop: asyncio.AbstractEventLoop,
                 bound: int | None = None):
        self.worker, self.req, self.loop = worker, req, loop
        self.bound = MAX_PENDING_UPDATES if bound is None else bound
        self._q: asyncio.Queue[Update] = asyncio.Queue()
        self.peak = 0                       # the most updates that ever waited
        self.overflowed = False             # the request was aborted for its unread updates

    def deliver(self, u: Update) -> None:
        """Called on the engine thread. Once the loop is closed (the server is shutting down)
        nobody is listening: the update is dropped, and the engine thread must not fail."""
        try:
            self.loop.call_soon_threadsafe(self._put, u)
        except RuntimeError:
            pass

    def _put(self, u: Update) -> None:
        final = u.finish_reason is not None
        if self.overflowed and not final:
            return
        self._q.put_nowait(u)
        self.peak = max(self.peak, self._q.qsize())
        if not final and not self.overflowed and self._q.qsize() >= self.bound - 1:
            self.overflowed = True
            log.warning("request %s: its client left %d updates unread; aborted",
                        self.req.rid, self._q.qsize())
            self.worker.abort(self.req)

    async def get(self) -> Update:
        return await self._q.get()

    def qsize(self) -> int:
        return self._q.qsize()


class ClosingStreamingResponse(StreamingResponse):
    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
