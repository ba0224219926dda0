"""The guard's per-send deadline (server/guard.py `_SendDeadline`): one timer per request, yet each
response message is held to the timeout on its own — quick sends adding up past it are fine, one
slow send is dropped at the timeout, and a cancellation that is not the deadline's stays one."""
from __future__ import annotations

import asyncio
import time

import pytest

from radixkv.server.guard import ABORT_KEY, RequestGuard

TIMEOUT = 0.2


def scope(aborted: list) -> dict:
    return {"type": "http", "method": "POST", "path": "/x", "headers": [], "client": None,
            "extensions": {ABORT_KEY: lambda: aborted.append(time.monotonic())}}


async def receive():
    return {"type": "http.request", "body": b"{}", "more_body": False}


def app_sending(delays: list[float], sent: list):
    """An app that sends one message per delay; the transport takes that long for each."""
    async def send(message):
        await asyncio.sleep(message["delay"])
        sent.append(message["delay"])

    async def app(scope, receive, wrapped_send):
        for d in delays:
            await wrapped_send({"type": "http.response.body", "delay": d})
    return app, send


def run(delays: list[float]) -> tuple[list, list, float]:
    sent, aborted = [], []
    app, send = app_sending(delays, sent)
    t0 = time.monotonic()
    asyncio.run(RequestGuard(app, 1 << 20, TIMEOUT)(scope(aborted), receive, send))
    return sent, aborted, time.monotonic() - t0


def test_quick_sends_that_add_up_past_the_timeout_are_not_a_stall():
    sent, aborted, took = run([0.05] * 10)          # 0.5 s in all, 0.05 s each
    assert sent == [0.05] * 10 and aborted == [] and took >= 0.5


def test_one_slow_send_is_dropped_at_the_timeout():
    sent, aborted, took = run([0.05, 0.05, 0.15, 5.0, 0.05])
    assert sent == [0.05, 0.05, 0.15] and len(aborted) == 1
    assert TIMEOUT <= took < 0.25 + TIMEOUT + 1.0     # the slow send's own deadline, not 5 s


def test_a_cancellation_that_is_not_the_deadlines_stays_a_cancellation():
    sent, aborted = [], []
    app, send = app_sending([5.0], sent)

    async def main():
        task = asyncio.create_task(RequestGuard(app, 1 << 20, 10.0)(scope(aborted), receive,
                                                                     send))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert sent == [] and aborted == []


def test_regression_a_stall_handled_by_the_app_leaves_later_cancellations_alone():
    """The deadline's cancellation is used once: an app that handles its stall and sends again,
    then is cancelled from elsewhere, ends cancelled (it used to be dropped as a second stall)."""
    from radixkv.server.guard import ClientStalled
    sent, aborted, handled = [], [], []
    _, send = app_sending([], sent)

    async def app(scope, receive, wrapped_send):
        try:
            await wrapped_send({"type": "http.response.body", "delay": 5.0})
        except ClientStalled:
            handled.append(time.monotonic())
        await wrapped_send({"type": "http.response.body", "delay": 5.0})

    async def main():
        task = asyncio.create_task(RequestGuard(app, 1 << 20, TIMEOUT)(scope(aborted), receive,
                                                                        send))
        await asyncio.sleep(TIMEOUT * 1.5)      # the first send stalled; the second is pending
        assert len(handled) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert sent == [] and aborted == []
