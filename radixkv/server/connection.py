"""uvicorn's HTTP protocol with a deadline on request headers.

uvicorn waits for headers forever: a client that trickles them (slowloris) or connects and
sends nothing holds a connection without end. Here a request's headers must complete within
`client_timeout` seconds of the connection opening, or of its first byte after a response;
else the client gets a 408 (OpenAI error body) and the connection is closed, with one warning.
Each request's scope also carries the connection's `abort` (server/guard.py drops a client that
stops reading with it) and the protocol itself (gateway/bridge.py writes a relayed stream to
its transport). The protocol is uvicorn's own choice (httptools when installed, else
h11), extended the same way: both keep the request in progress in `cycle`.
"""
from __future__ import annotations

import asyncio
import json
import logging

from radixkv.server import protocol as P
from radixkv.server.guard import ABORT_KEY, CONNECTION_KEY, DEFAULT_CLIENT_TIMEOUT

log = logging.getLogger(__name__)


class _HeaderDeadline:
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._seen = None                      # the last request whose headers arrived
        self._deadline = self.loop.call_later(self.client_timeout, self._headers_late)

    def data_received(self, data: bytes) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        super().data_received(data)
        if self.cycle is not None and self.cycle is not self._seen:     # headers complete
            self._seen = self.cycle
            ext = self.cycle.scope.setdefault("extensions", {})
            ext[ABORT_KEY], ext[CONNECTION_KEY] = self.transport.abort, self
            self._disarm()
        elif idle and self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.client_timeout, self._headers_late)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.warning("%s: the request headers did not arrive within %gs (--client-timeout); "
                    "answered 408", peer, self.client_timeout)
        msg = f"the request headers did not arrive within {self.client_timeout:g}s " \
              f"(--client-timeout)"
        body = json.dumps(P.error_body(msg, "timeout", None, 408)).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (len(body), body))
        self.transport.close()


def guarded_protocol(client_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, with headers due within `client_timeout` seconds."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol    # httptools, else h11
    return type("GuardedHTTPProtocol", (_HeaderDeadline, AutoHTTPProtocol),
                {"client_timeout": client_timeout})
