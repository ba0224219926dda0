"""Whether a worker's KV events hold what the gateway sends it.

A worker fed by KV events stores every prompt it prefills, so the first page of a prompt sent
to it shows up in its events soon after. When none of the prompts the gateway checks ever
does, the gateway is looking prompts up by other hashes than the worker's events carry (a
vLLM worker hashed as radixkv hashes, a PYTHONHASHSEED the gateway does not know), or no event
reaches it at all (vLLM's publisher connects to a concrete tcp endpoint, which the gateway must
then bind: `--kv-events-bind`): every prediction is 0 and events only make routing worse. `HashCheck` counts the checked
prompts found and missing and says so once, in the log and on /metrics.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import NamedTuple

log = logging.getLogger(__name__)

SETTLE_S = 2.0          # a prompt sent this long ago has been prefilled and announced
WARN_AFTER = 20         # checked prompts, none found: the worker's hashes are not these
_PENDING_MAX = 256      # prompts awaiting their check (the oldest are dropped past it)


class HashCounts(NamedTuple):
    found: int           # prompts sent whose first page the worker's events then held
    missing: int         # prompts sent whose first page they did not
    mismatch: bool       # WARN_AFTER or more missing and none found


class HashCheck:
    def __init__(self, url: str, endpoint: str):
        self.url, self.endpoint = url, endpoint
        self._pending: deque[tuple[float, int]] = deque(maxlen=_PENDING_MAX)
        self.found = self.missing = 0
        self._warned = False

    def sent(self, first_page: int, now: float) -> None:
        """A prompt whose first page hashes to `first_page` went to the worker at `now`."""
        self._pending.append((now, first_page))

    def check(self, holds, now: float, batches: int) -> None:
        """Check the prompts sent at least SETTLE_S before `now` against `holds` (a container
        of the page hashes the worker's events hold); `batches`: event batches received."""
        while self._pending and now - self._pending[0][0] >= SETTLE_S:
            _, h = self._pending.popleft()
            if h in holds:
                self.found += 1
            else:
                self.missing += 1
        if self.mismatch and not self._warned:
            self._warned = True
            if batches == 0:
                log.warning("no KV event has arrived from %s at %s after %d prompts: a vLLM "
                            "worker given a concrete tcp endpoint connects to it (give it with "
                            "--kv-events-bind, or tcp://*:PORT or ipc:// to the worker), or "
                            "the worker publishes nothing",
                            self.url, self.endpoint, self.missing)
            else:
                log.warning("none of %d prompts sent to %s showed up in its KV events: they "
                            "carry other page hashes than the gateway computes (--kv-hash; a "
                            "vLLM worker's PYTHONHASHSEED changes its hashes)",
                            self.missing, self.url)

    @property
    def mismatch(self) -> bool:
        return self.found == 0 and self.missing >= WARN_AFTER

    def counts(self) -> HashCounts:
        return HashCounts(self.found, self.missing, self.mismatch)
