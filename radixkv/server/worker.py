"""The engine thread: one Engine stepping beside the HTTP event loop, never inside it.

The HTTP side talks to it through an inbox (submit, abort, call) and gets each request's
tokens back through the `deliver` callback it passed, called on the engine thread after every
step (the app forwards them into its event loop with call_soon_threadsafe). Everything that
touches the engine, its cache or its pool happens on this thread, between steps.

Time: the engine's clock is seconds since the worker started. Before each step it is moved up
to the wall clock (arrivals are stamped with the wall clock when submitted); a real executor's
step then advances it by the measured duration. With `pace` (the simulated GPU) the thread
sleeps until the wall clock reaches the simulated step's end before it hands out the step's
tokens and KV events, so a client sees the cost model's latencies: a prefill's first token
comes after the prefill, not as it starts.

Failure: an exception on the engine thread (a bug, or one injected with `inject_failure` or
`fault_after_steps`) ends the thread. Every request in flight is taken out of the engine (its
slots and lock released, when the engine's state allows it) and ends with "error"; `error`
names the exception, so the routes answer 503 from then on; `on_failure(exc)` is called last.
`close(reason)` ends the requests in flight the same way without a failure (a shutdown that
will not wait for them).
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, NamedTuple

from radixkv.engine.engine import Engine
from radixkv.sched.request import Request

log = logging.getLogger(__name__)
FORGET_EVERY = 64          # steps between dropping the engine's finished-request history


class Update(NamedTuple):
    tokens: tuple[int, ...]                 # output tokens produced since the last update
    finish_reason: str | None = None        # "stop" | "length" | "abort" | "error" at the end
    usage: tuple[int, int, int] | None = None   # (prompt, completion, cached) at the end
    message: str | None = None              # with "error": why, when the engine did not fail


class _Track:
    __slots__ = ("req", "deliver", "sent", "last_token")

    def __init__(self, req: Request, deliver: Callable[[Update], Any]):
        self.req, self.deliver, self.sent, self.last_token = req, deliver, 0, None


class EngineWorker:
    def __init__(self, engine: Engine, *, pace: bool = False, metrics: Any = None,
                 publisher: Any = None, fault_after_steps: int | None = None):
        self.engine, self.pace, self.metrics, self.publisher = engine, pace, metrics, publisher
        self.error: str | None = None               # set when a step failed: the server is down
        self.on_failure: Callable[[BaseException], Any] | None = None   # else: logged here
        # fault injection: the step taken once engine.steps reaches _fault_at raises _fault
        self._fault: BaseException = RuntimeError(
            f"injected fault after {fault_after_steps} steps (RADIXKV_FAULT_AFTER_STEPS)")
        self._fault_at = math.inf if fault_after_steps is None else fault_after_steps
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._closed = False                        # set once: the inbox answers nothing more
        self._lock = threading.Lock()
        self._active: dict[int, _Track] = {}
        self._finished: list[Request] = []
        self._t0 = time.monotonic()
        engine.on_finish = self._finished.append
        engine.sched.on_admit = self._admitted
        self._thread = threading.Thread(target=self._loop, name="radixkv-engine", daemon=True)

    # ---- thread-safe API ----------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, req: Request, deliver: Callable[[Update], Any]) -> None:
        req.arrival = self.now()
        self._put(("add", req, deliver))

    def abort(self, req: Request) -> None:
        self._put(("abort", req))

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run fn(engine) on the engine thread between steps; its result in the future."""
        fut: Future = Future()
        if not self.alive():
            fut.set_exception(RuntimeError(self.error or "the engine is not running"))
            return fut
        self._put(("call", fn, fut))
        return fut

    def inject_failure(self, exc: BaseException) -> None:
        """Fault injection (tests, drills): the engine thread's next step raises `exc` instead
        of running, before it changes anything. Unused, it costs one comparison per step."""
        self._fault, self._fault_at = exc, 0
        self._wake.set()

    def close(self, reason: str) -> None:
        """End every request in flight with "error" and `reason` as the error, and stop the
        thread, without waiting for it (called from the event loop, which must stay free to
        deliver the endings)."""
        if self.error is None:
            self.error = reason
        self._stop = True
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _put(self, item: tuple) -> None:
        with self._lock:
            if not self._closed:
                self._inbox.put(item)
                self._wake.set()
                return
        _refuse(item, "error" if self.error else "abort")    # the engine thread has ended

    # ---- the engine thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        eng, stuck = self.engine, False
        try:
            while not self._stop:
                if not eng.has_work() or stuck:
                    self._wake.wait(0.5 if not eng.has_work() else 0.005)
                self._wake.clear()
                self._drain()
                if self._stop or not eng.has_work():
                    continue
                if eng.steps >= self._fault_at:
                    raise self._fault
                eng.now = max(eng.now, self.now())
                evicted, retracted = eng.manager.evicted_tokens, eng.sched.counters.retractions
                stuck = not eng.step()
                if self.pace:        # a step's tokens and events exist at its end, not its start
                    ahead = eng.now - self.now()
                    if ahead > 0:
                        time.sleep(ahead)
                self._after_step(eng.manager.evicted_tokens - evicted,
                                 eng.sched.counters.retractions - retracted)
        except BaseException as e:                  # a bug: fail loudly, never hang clients
            self.error = f"engine failure: {type(e).__name__}: {e}"
            self._close_all("error")
            if self.on_failure is None:
                log.exception("the engine thread failed")
            else:
                try:
                    self.on_failure(e)
                except Exception:
                    log.exception("the engine failure callback failed")
        else:
            self._close_all("error" if self.error else "abort")

    def _drain(self) -> None:
        eng, drained = self.engine, False
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                if drained:              # an arrival, abort or call changed what the gauges show
                    self._gauges()
                return
            drained = True
            kind = item[0]
            if kind == "add":
                _, req, deliver = item
                try:
                    eng.add_request(req)
                except ValueError as e:             # checked by the app already; belt and braces
                    log.warning("refused %s: %s", req.rid, e)
                    deliver(Update((), "error", (req.prompt_len, 0, 0), f"refused: {e}"))
                    continue
                self._active[id(req)] = _Track(req, deliver)
            elif kind == "abort":
                req = item[1]
                tr = self._active.pop(id(req), None)
                if tr is not None and eng.abort(req):
                    if self.metrics is not None:
                        self.metrics.aborted.inc()
                    tr.deliver(Update((), "abort", (req.prompt_len, len(req.output), req.cached_tokens)))
            else:
                _, fn, fut = item
                try:
                    fut.set_result(fn(eng))
                except Exception as e:              # the caller's error, returned to it
                    fut.set_exception(e)
                self._publish()

    def _admitted(self, req: Request) -> None:
        if req.retractions == 0 and self.metrics is not None:     # first admission only
            self.metrics.first_admit(req.prompt_len, req.cached_tokens)

    def _after_step(self, evicted: int, retracted: int) -> None:
        eng, m = self.engine, self.metrics
        done = {id(r) for r in self._finished}
        for key, tr in list(self._active.items()):
            req = tr.req
            out = req.output
            if len(out) > tr.sent:
                new = tuple(out[tr.sent:])
                if m is not None:
                    m.tokens(len(new), None if tr.last_token is None else eng.now - tr.last_token)
                tr.sent, tr.last_token = len(out), eng.now
            else:
                new = ()
            if key in done:
                del self._active[key]
                reason = "length" if len(out) >= req.max_new_tokens else "stop"
                if m is not None:
                    m.finished(req.first_token - req.arrival, req.finish_time - req.arrival,
                               req.first_admit - req.arrival)
                tr.deliver(Update(new, reason, (req.prompt_len, len(out), req.cached_tokens)))
            elif new:
                tr.deliver(Update(new))
        self._finished.clear()
        self._publish()
        if m is not None:
            m.step(evicted, retracted)
            self._gauges()
        if eng.steps % FORGET_EVERY == 0:
            eng.forget_finished()

    def _gauges(self) -> None:
        eng, m = self.engine, self.metrics
        if m is not None:
            sch, pool = eng.sched, eng.pool
            in_use = pool.used() - eng.cache.evictable_size()
            m.gauges(sch.num_admitted, len(sch.waiting), in_use / max(pool.num_slots, 1))

    def _publish(self) -> None:
        log = self.engine.cache.events() if self.publisher is not None else None
        if log is not None:
            events = log.take()
            if events:
                self.publisher.publish(events)

    def _close_all(self, reason: str) -> None:
        with self._lock:                             # nothing enters the inbox after this
            self._closed = True
        released = True
        for tr in self._active.values():             # free their slots and locks, if it can
            if released:
                try:
                    self.engine.abort(tr.req)
                except Exception:                    # a step failed halfway: leave the rest
                    log.warning("could not release the requests in flight", exc_info=True)
                    released = False
        for tr in self._active.values():
            r = tr.req
            if reason == "error" and self.metrics is not None:
                self.metrics.failed.inc()
            tr.deliver(Update((), reason, (r.prompt_len, len(r.output), r.cached_tokens)))
        self._active.clear()
        if released:
            try:
                self._gauges()
            except Exception:
                log.warning("could not read the engine's gauges", exc_info=True)
        while True:                                  # what was queued behind the stop
            try:
                _refuse(self._inbox.get_nowait(), reason)
            except queue.Empty:
                break


def _refuse(item: tuple, reason: str) -> None:
    """Answer an inbox item the engine will never run: a call fails, a request ends."""
    if item[0] == "call":
        item[2].set_exception(RuntimeError("the engine stopped"))
    elif item[0] == "add":
        item[2](Update((), reason, (item[1].prompt_len, 0, 0)))


def engine_stats(eng: Engine) -> dict:
    """What /server_info reports live (called on the engine thread)."""
    sch, pool = eng.sched, eng.pool
    return {"running": sch.num_admitted,
            "waiting": len(sch.waiting),
            "kv_slots_used": pool.used(), "kv_slots_evictable": eng.cache.evictable_size(),
            "kv_capacity": pool.num_slots, "cached_tokens_in_tree": eng.cache.total_size(),
            "evicted_tokens": eng.manager.evicted_tokens,
            "retractions": sch.counters.retractions, "steps": eng.steps}
