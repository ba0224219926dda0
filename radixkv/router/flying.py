"""The pages of the prompts routed to one replica and not finished yet, by their chained hashes:
what the replica will hold once it has prefilled them (router/radixkv.py counts them as held).

A prompt's hashes are computed as far as routing read them (kvevents/hashes.py `PageHashes`),
which for a fresh prompt is its first span: only those pages are registered when it is routed.
The rest register when a later prompt needs them: a prompt whose pages are held or in flight up
to a page p, where p is not, but p - 1 is the last page registered of some prompts in flight,
agrees with those prompts up to p (the hashes are chained), so their next spans are hashed and
registered and the match goes on. A page is then in `count` exactly when the replica's page-by-
page view of its prompts in flight, hashed whole, would hold it for every match that reads it;
pages never registered are each one prompt's own (a prompt sharing them would have registered
them), so the distinct pages in flight are `len(count)` plus those.
"""
from __future__ import annotations

from collections.abc import Mapping
from itertools import compress, count, repeat
from operator import not_, or_

from radixkv.kvevents.hashes import PageHashes


class FlyingPages:
    def __init__(self) -> None:
        self.count: dict[int, int] = {}       # page hash -> prompts in flight registering it
        self._reg: dict[str, tuple[PageHashes, int]] = {}    # rid -> (its hashes, registered)
        self._frontier: dict[int, list[str]] = {}   # last registered page -> rids with more
        self._unregistered = 0                       # pages in flight not registered

    def __bool__(self) -> bool:
        return bool(self._reg)

    def distinct(self) -> int:
        """Distinct pages of the prompts in flight."""
        return len(self.count) + self._unregistered

    def add(self, rid: str, hashes: PageHashes) -> None:
        """`rid`'s prompt is in flight: register its pages hashed so far (at least one)."""
        if rid in self._reg:
            raise ValueError(f"request {rid!r} is already in flight here")
        self._reg[rid] = (hashes, 0)
        self._unregistered += len(hashes)
        if len(hashes):
            self._register(rid, len(hashes.extend_to(1)))

    def remove(self, rid: str) -> None:
        hashes, reg = self._reg.pop(rid)
        self._unregistered -= len(hashes) - reg
        if not reg:
            return
        pages, count_ = hashes.extend_to(reg)[:reg], self.count   # a prompt's pages are distinct
        left = list(map((-1).__add__, map(count_.pop, pages, repeat(1))))
        if left.count(0) != len(left):                  # pages other prompts still fly
            count_.update(compress(zip(pages, left), left))
        if reg < len(hashes):
            self._unfront(pages[-1], rid)

    def run(self, held: Mapping[int, int], hashes: PageHashes, start: int) -> int:
        """Leading pages of `hashes` held (in `held`) or in flight, given that the first
        `start` are held."""
        n, k = len(hashes), start
        while k < n:
            got = hashes.extend_to(k + 1)
            rest = got[k:]
            known = map(or_, map(held.__contains__, rest), map(self.count.__contains__, rest))
            j = next(compress(count(k), map(not_, known)), None)
            if j is None:
                k = len(got)
            elif j and self._extend(got[j - 1]):
                k = j                             # registered further: look at page j again
            else:
                return j
        return n

    # ---- registration -------------------------------------------------------------------------
    def _register(self, rid: str, upto: int) -> None:
        hashes, reg = self._reg[rid]
        got = hashes.extend_to(upto)
        new, count_ = got[reg:upto], self.count
        count_.update(zip(new, map((1).__add__, map(count_.get, new, repeat(0)))))
        if reg:
            self._unfront(got[reg - 1], rid)
        if upto < len(hashes):
            self._frontier.setdefault(got[upto - 1], []).append(rid)
        self._unregistered -= upto - reg
        self._reg[rid] = (hashes, upto)

    def _extend(self, last: int) -> bool:
        """Register the next span of every prompt whose last registered page is `last`; False
        when there is none."""
        rids = self._frontier.pop(last, None)
        if not rids:
            return False
        for rid in rids:
            hashes, reg = self._reg[rid]
            self._register(rid, len(hashes.extend_to(reg + 1)))
        return True

    def _unfront(self, last: int, rid: str) -> None:
        rids = self._frontier.get(last)
        if rids and rid in rids:
            rids.remove(rid)
            if not rids:
                del self._frontier[last]
