"""LRU hit tokens at every KV capacity in one pass over a workload (Mattson stack distances).

What it reproduces: `radixkv.offline.replay.replay` under LRU with page-granularity eviction, for the
radix tree (`RadixCache(evict_granularity="page")`, any page size) and for the block-hash cache
(page = block): `hit_tokens` and the per-request `hits`, exactly, at every capacity at once.

Why one order serves every capacity. Between requests nothing runs and nothing is locked, so
at capacity C the cache holds some number k(C) of pages (blockhash: blocks). Every request ends
with an insert of its whole path (prompt + output, whole pages), which touches every page of
it: afterwards its pages are the most recent ones, shallower ahead of deeper (an LRU leaf is
trimmed from the end of its edge; blockhash returns a request's blocks to the free queue last
block first), and the order among all other pages does not change during the request. So the
order of pages by recency is the same at every capacity, and the cache at capacity C is
exactly its k(C) most recent pages. What differs per capacity is only the scalar k, which each
replay step moves by simple arithmetic on ranks along the request's own path:

  c  = pages of the path ranked <= k (cached: a prefix of the path, ancestors rank ahead)
  h  = min(M, c)                  hit pages; M = whole pages of the prompt minus its last token
  a  = ceil(L / ps) - h           pages allocated for the prompt (L = prompt length)
  e1 = max(0, a - (P - k))        pages evicted for them (P = pool pages); the h hit pages are
                                  locked and all rank ahead of the path's deeper pages, so a
                                  deeper cached page j survives iff rank_j <= k - e1
  prompt insert (only with output): the F = floor(L / ps) whole prompt pages enter; radix frees
                                  surviving deeper ones as duplicates, blockhash registers a
                                  second copy of them
  e2 = max(0, b - free)           pages evicted for the b output pages; a deeper output-range
                                  page survives iff rank_j <= k - e1 - e2
  final insert: the A = floor((L + out) / ps) path pages are cached, the partial tail is freed

  radix:     k' = (k - c) - (pages of others evicted) + A
  blockhash: k' = k - e1 - e2 + (A - h)       (every page past the hit is registered anew)

A capacity below one page, or below the largest request's page-rounded prompt + output, is one
replay refuses: it is reported infeasible (hit tokens -1), and every step above fits at every
feasible capacity, so nothing else can fail mid-pass.

Ranks (stacktree.py). The unlimited cache's radix tree (one root per namespace) is built as
the pass goes, and split wherever a request's path ends or diverges, so every page of a node
was last touched by the same request. Each request restamps its path's nodes, the root-most
newest; a Fenwick tree over stamps weighted by page counts gives the pages more recent than a
node, so a path costs O(nodes on it x log) and the per-capacity arithmetic is numpy over the
capacity axis.

Blockhash duplicates. When a request's deeper path content is still cached at its insert (the
last prompt block, which the len - 1 rule leaves unmatched, or a repeated output), blockhash
registers a second copy: capacity-dependent blocks that take slots without being the recent
copy. Capacities that hold such copies, or make one in the current request, take a scalar path
that tracks them individually: each copy keeps the (stamp, depth) position it was left at, and
a match locks and refreshes the oldest registered copy, as the cache does. They are rare (a
repeated prompt), so the vectorised path carries every other capacity.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from radixkv.cache.key import RadixKey
from radixkv.offline.planning.stacktree import NEVER, Node, PathRanks, StampTree
from radixkv.offline.replay import computed_output, pool_size, request_need
from radixkv.workloads import TraceRequest

KINDS = ("radix", "blockhash")


@dataclass(frozen=True)
class CurveResult:
    kind: str                      # "radix" | "blockhash"
    page_size: int                 # tokens per page (blockhash: per block)
    capacities: np.ndarray         # (n_cap,) int64 pool sizes in tokens, rounded down to pages
    hit_tokens: np.ndarray         # (n_cap,) int64; -1 where infeasible
    hits: np.ndarray               # (n_requests, n_cap) int64 per-request hit tokens; -1 where infeasible
    feasible: np.ndarray           # (n_cap,) bool: replay can run (one page, largest request fits)
    footprint_tokens: int          # replay's pool size with capacity None (nothing evicted)
    peak_tokens: int               # most tokens the unlimited cache and the running request hold:
                                   # the smallest pool at which replay evicts nothing
    prompt_tokens: int

    @property
    def hit_rate(self) -> np.ndarray:
        """(n_cap,) float hit tokens / prompt tokens; NaN where infeasible."""
        rate = self.hit_tokens / self.prompt_tokens if self.prompt_tokens else np.zeros(len(self.hit_tokens))
        return np.where(self.feasible, rate, np.nan)


def _requests(requests) -> list[TraceRequest]:
    reqs = list(requests)
    for r in reqs:
        if not isinstance(r, TraceRequest):
            raise TypeError(f"expected TraceRequests, got {type(r).__name__}")
    return reqs


def _check_args(kind: str, page_size: int) -> None:
    """Refuse an unknown cache kind or a page size that is not a positive int."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if type(page_size) is not int or page_size < 1:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")


def _capacities(capacities: Iterable[int | None]) -> list[int | None]:
    """The capacities as a list, each a positive number of tokens or None (unlimited)."""
    caps = list(capacities)
    for c in caps:
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1):
            raise ValueError(f"capacity must be a positive number of tokens or None, got {c!r}")
    return caps


def lru_hit_curve(requests: Iterable[TraceRequest], kind: str, page_size: int,
                  capacities: Sequence[int | None]) -> CurveResult:
    """Hit tokens of `replay(requests, cache, capacity)` for every capacity in `capacities`
    (tokens; None: unlimited), for `kind` "radix" (LRU, page-granularity eviction, pages of
    `page_size`) or "blockhash" (blocks of `page_size`), in one pass over the requests."""
    _check_args(kind, page_size)
    reqs = _requests(requests)
    ps = page_size
    caps = _capacities(capacities)
    unlimited = pool_size(reqs, ps, None)
    need = request_need(reqs, ps)
    slots = np.array([unlimited if c is None else int(c) - int(c) % ps for c in caps], np.int64)
    feasible = (slots >= ps) & (slots >= need)

    P = slots[feasible] // ps                          # pool pages per feasible capacity
    hit_cols, peak = _one_pass(reqs, kind == "radix", ps, P)

    hits = np.full((len(reqs), len(caps)), -1, np.int64)
    hits[:, feasible] = hit_cols
    hit_tokens = np.full(len(caps), -1, np.int64)
    hit_tokens[feasible] = hit_cols.sum(axis=0)
    return CurveResult(kind=kind, page_size=ps, capacities=slots, hit_tokens=hit_tokens,
                       hits=hits, feasible=feasible, footprint_tokens=int(unlimited),
                       peak_tokens=int(peak), prompt_tokens=sum(len(r.prompt) for r in reqs))


def _one_pass(reqs: list[TraceRequest], radix: bool, ps: int, P: np.ndarray) -> tuple[np.ndarray, int]:
    """The pass itself: for pool sizes `P` ((n_cap,) int64 pages of `ps` tokens, all feasible)
    of the radix (`radix`) or block-hash cache, the (n_requests, n_cap) int64 hit tokens of
    each request at each capacity, and the peak tokens of the unlimited cache (see
    `CurveResult.peak_tokens`)."""
    ncap = len(P)
    k = np.zeros(ncap, np.int64)                       # cached pages (blocks) per capacity
    hit_cols = np.zeros((len(reqs), ncap), np.int64)
    tree = StampTree(ps)
    dups: list[dict[int, tuple]] = [{} for _ in range(ncap)]  # blockhash: copies per capacity
    filler, peak, cached_unlimited = 0, 0, 0
    for i, r in enumerate(reqs):
        key = RadixKey(r.prompt, r.extra_key, r.cache_salt)
        out, filler = computed_output(r, filler)      # as replay: what gets KV
        L, T = len(key), len(key) + len(out)
        M, F, A = (L - 1) // ps, L // ps, T // ps
        n_prompt = -(-L // ps)
        b = -(-T // ps) - n_prompt                     # output pages grown
        has_out = len(out) > 0
        path, new = tree.walk(key + out, A) if A else ([], False)
        R = tree.ranks(path, new)
        w = np.array([n.npages for n in path], np.int64)
        d0 = np.array([n.depth for n in path], np.int64)
        seg = PathRanks(R, w, d0)

        # the unlimited cache: pages held before, plus this request's own at their most
        # (after admit, and after the output pages are grown)
        c_inf = A - int(w[-1]) if new else A
        h_inf = min(M, c_inf)
        if radix:
            grown = F - max(h_inf, min(c_inf, F)) + n_prompt - F + b if has_out else 0
            peak = max(peak, (cached_unlimited + max(n_prompt - h_inf, grown)) * ps)
            cached_unlimited += A - c_inf
        else:
            peak = max(peak, (cached_unlimited + n_prompt - h_inf + b) * ps)
            cached_unlimited += A - h_inf

        if ncap:
            c = seg.count(k)
            h = np.minimum(M, c)
            a = n_prompt - h
            e1 = np.maximum(0, a - (P - k))
            s1 = np.maximum(h, seg.count(k - e1))      # path pages cached after e1
            if radix:
                k = _radix_next(seg, k, P, c, s1, e1, F, A, n_prompt, b, has_out)
            else:
                k = _blockhash_next(tree, path, seg, dups, k, P, h, s1, e1, a, M, F, A, n_prompt,
                                    b, has_out)
            hit_cols[i] = h * ps
        tree.touch(path, new)
    return hit_cols, peak


def _radix_next(seg: PathRanks, k: np.ndarray, P: np.ndarray, c: np.ndarray, s1: np.ndarray,
                e1: np.ndarray, F: int, A: int, n_prompt: int, b: int, has_out: bool) -> np.ndarray:
    """(n_cap,) radix pages cached after the request, from those before (`k`), given the
    path pages cached at admit (`c`), those left after its e1 evictions (`s1`), and the
    request's page counts (see the module docstring)."""
    gone1 = c - s1                                     # deeper path pages among the e1
    if has_out:
        tree1 = k - e1 + F - np.minimum(s1, F)
        e2 = np.maximum(0, b - (P - tree1 - (n_prompt - F)))
        s2 = seg.count(k - e1 - e2)
        gone2 = np.maximum(0, s1 - F) - np.maximum(0, s2 - F)
    else:
        e2 = gone2 = 0
    return (k - c) - (e1 - gone1) - (e2 - gone2) + A


def _blockhash_next(tree: StampTree, path: list[Node], seg: PathRanks, dups: list[dict[int, tuple]],
                    k: np.ndarray, P: np.ndarray, h: np.ndarray, s1: np.ndarray, e1: np.ndarray,
                    a: np.ndarray, M: int, F: int, A: int, n_prompt: int, b: int,
                    has_out: bool) -> np.ndarray:
    """(n_cap,) blocks cached after the request, from those before (`k`), given its hit
    blocks (`h`), the path blocks left after its e1 evictions (`s1`) and the blocks it
    allocates for the prompt (`a`). Capacities with duplicate copies, held or made now, take
    `_blockhash_scalar`, which overwrites their `h` in place and updates their `dups`."""
    e2 = np.maximum(0, b - (P - k + e1 - a)) if has_out else 0
    k_next = k - e1 - e2 + (A - h)
    slow = s1 > h                                      # a copy registered at this capacity
    for q in range(len(P)):
        if dups[q] or slow[q]:
            h[q], k_next[q] = _blockhash_scalar(
                tree, path, seg, dups[q], int(k[q]), int(P[q]), M, F, A, n_prompt,
                b, has_out)
    return k_next


def _blockhash_scalar(tree: StampTree, path: list[Node], seg: PathRanks, dups: dict[int, tuple],
                      k: int, P: int, M: int, F: int, A: int, n_prompt: int, b: int,
                      has_out: bool) -> tuple[int, int]:
    """One request at one capacity of the block-hash cache, with its duplicate copies.

    `dups` maps a content page id (stable: `Node.base` + offset) with more than one cached
    copy to (its depth, its copies in registration order, oldest first: the one a match
    uses). A copy is None when it sits at the content's own recency position (its newest
    touch), else the frozen (stamp, depth) where it was left. Updated in place; returns
    (hit pages, k'). Costs O(copies + new copies) rank look-ups of O(log) each."""
    fen, stamps = tree.fen, [n.stamp for n in path]
    R, d0 = seg.R.tolist(), seg.d0.tolist()              # scalar look-ups: lists beat numpy
    frozen = [(cp, cid) for cid, (_, copies) in dups.items() for cp in copies if cp is not None]
    fkeys = sorted((-s, d) for (s, d), _ in frozen)     # ascending = most recent first

    def ahead(s: int, d: int) -> int:                    # frozen copies more recent than (s, d)
        return bisect.bisect_left(fkeys, (-s, d))

    def node_of(j: int) -> int:
        return bisect.bisect_right(d0, j) - 1

    def lead_rank(j: int) -> int:                        # rank of page j's recent copy
        i = bisect.bisect_right(d0, j) - 1
        if R[i] >= NEVER:
            return int(NEVER)
        return R[i] + (j - d0[i]) + ahead(stamps[i], j)

    def frozen_rank(s: int, d: int) -> int:              # pages at stamp s lie deeper than d
        return fen.newer(s) + 1 + ahead(s, d)

    def cid_of(j: int) -> int:
        i = bisect.bisect_right(d0, j) - 1
        return path[i].base + (j - d0[i])

    # contents with copies that lie on this path: (content id, depth, copies)
    on_path = [(cid, d, copies) for cid, (d, copies) in dups.items() if d < A and cid_of(d) == cid]
    c = _first_failing(lambda j: lead_rank(j) <= k, 0, A)
    h = min(M, c)
    # a match locks the oldest copy of each hit page: where that is a frozen copy, the recent
    # copy stays unlocked
    hit_frozen = [(cid, d, copies) for cid, d, copies in on_path if d < h and copies[0] is not None]
    a = n_prompt - h
    e1 = max(0, a - (P - k))
    e2 = max(0, b - (P - k + e1 - a)) if has_out else 0
    s2 = _evict_copies(dups, frozen, hit_frozen, lead_rank, frozen_rank, h, c, k - h - e1, e1, e2)
    _register_copies(dups, on_path, hit_frozen, h, s2, stamps, node_of, cid_of)
    return h, k - e1 - e2 + (A - h)


def _first_failing(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """The first j in [lo, hi) failing `pred` (hi if none), for a `pred` that holds on a
    prefix of the range and fails on the rest: a binary search."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _evict_copies(dups: dict[int, tuple], frozen: list[tuple], hit_frozen: list[tuple],
                  lead_rank: Callable[[int], int], frozen_rank: Callable[[int, int], int],
                  h: int, c: int, keep1: int, e1: int, e2: int) -> int:
    """The request's e1 evictions (for its prompt pages; `keep1` unlocked pages stay) and e2
    (for its output pages) at one capacity of `_blockhash_scalar`: drops the copies they
    take from `dups` and returns the path pages still cached after both (of the `c` cached
    at admit, the first `h` hit and locked). `lead_rank(j)` ranks path page j's recent
    copy, `frozen_rank(s, d)` the frozen copy left at (s, d); `frozen` holds every frozen
    copy as ((stamp, depth), content id), `hit_frozen` the hit pages whose oldest copy is
    frozen, as (content id, depth, copies)."""
    locked_frozen = sorted(frozen_rank(*copies[0]) for _, _, copies in hit_frozen)
    unlocked_leads = sorted(lead_rank(d) for _, d, _ in hit_frozen)

    last_hit = lead_rank(h - 1) if h else 0

    def locked_below(x: int) -> int:                     # locked copies ranked ahead of x
        leads = h if x > last_hit else _first_failing(lambda j: lead_rank(j) < x, 0, h)
        return leads - bisect.bisect_left(unlocked_leads, x) + bisect.bisect_left(locked_frozen, x)

    def survives(x: int, keep: int) -> bool:             # an unlocked copy at rank x, when the
        return x - locked_below(x) <= keep               # `keep` most recent unlocked ones stay

    keep2 = keep1 - e2
    locked_first = {cid for cid, _, _ in hit_frozen}

    def prune(keep: int) -> None:
        """Drop the copies an eviction leaving `keep` unlocked ones takes: frozen copies (not
        the locked oldest copy of a hit page) and the unlocked recent copies of hit pages."""
        for (s, d), cid in frozen:
            copies = dups[cid][1]
            if (s, d) not in copies or (cid in locked_first and copies[0] == (s, d)):
                continue
            if not survives(frozen_rank(s, d), keep):
                copies.remove((s, d))
        for cid, d, copies in hit_frozen:
            if None in copies and not survives(lead_rank(d), keep):
                copies.remove(None)

    s1 = _first_failing(lambda j: survives(lead_rank(j), keep1), h, c) if e1 else c
    if e1:
        prune(keep1)
    s2 = s1                                              # path pages still cached after e2
    if e2:
        s2 = _first_failing(lambda j: survives(lead_rank(j), keep2), h, s1)
        prune(keep2)
    return s2


def _register_copies(dups: dict[int, tuple], on_path: list[tuple], hit_frozen: list[tuple],
                     h: int, s2: int, stamps: list[int], node_of: Callable[[int], int],
                     cid_of: Callable[[int], int]) -> None:
    """The request's final insert at one capacity of `_blockhash_scalar`, in `dups`: the
    copies of `on_path` (its contents with copies, as (content id, depth, copies)) and
    `hit_frozen` (those of them hit with a frozen oldest copy) after the path's pages past
    the `h` hit are registered anew, `s2` of them still cached; contents left with one copy
    leave `dups`. `stamps` are the path nodes' stamps, `node_of(j)` the node holding path
    page j, `cid_of(j)` its content id."""
    # pages [h, A) are registered anew: a surviving older copy stays, frozen where the content
    # was; pages past s2 have no older copy left
    for cid, d, copies in on_path:
        if h <= d and d >= s2:
            copies[:] = [cp for cp in copies if cp is not None] + [None]
    for j in range(h, s2):
        cid = cid_of(j)
        old = (stamps[node_of(j)], j)
        copies = dups[cid][1] if cid in dups else [None]
        dups[cid] = (j, [old if cp is None else cp for cp in copies] + [None])
    # hit pages: the oldest copy, matched, becomes the recent one; the previous recent copy,
    # if it survived, is left behind
    for cid, d, copies in hit_frozen:
        old = (stamps[node_of(d)], d)
        copies[:] = [None] + [old if cp is None else cp for cp in copies[1:]]
    for cid in [cid for cid, (_, copies) in dups.items() if len(copies) < 2]:
        del dups[cid]
