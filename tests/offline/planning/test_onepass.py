"""One-pass LRU hit curves: equal, capacity by capacity and request by request, to `replay`
(radix with page-granularity eviction at pages 1 and 16, blockhash at blocks of 16), and to
a page-level reference simulator written from the caches' mechanics, not from the curve's
arithmetic."""
from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest

from radixkv.cache.key import RadixKey
from radixkv.config import CacheConfig
from radixkv.offline.planning.onepass import lru_hit_curve
from radixkv.offline.replay import computed_output, replay
from radixkv.workloads import TraceRequest, Workload, make_workload, read_hash_id_trace

SMALL = {
    "support": dict(num_users=6, turns=3, system_len=100, fewshot_len=150, rag_len=200,
                    msg_len=(5, 40), reply_len=(5, 60)),
    "multiturn": dict(num_users=6, turns=4, system_len=20, msg_len=(5, 40), reply_len=(0, 50)),
}
LINES = [("radix", 1), ("radix", 16), ("blockhash", 16)]


def hash_trace(path, n: int = 70, seed: int = 0) -> Workload:
    """A Mooncake-format trace of 16-token blocks: a few shared prefix chains, continued by
    fresh blocks, often repeating an earlier prompt exactly; lengths often whole blocks (the
    len - 1 rule then leaves a cached last block unmatched: blockhash copies it)."""
    rng = np.random.default_rng(seed)
    chains, rows, next_id = [list(range(i * 8, i * 8 + 8)) for i in range(4)], [], 32
    for t in range(n):
        if rows and rng.random() < 0.3:
            row = dict(rows[int(rng.integers(len(rows)))])
        else:
            base = chains[int(rng.integers(len(chains)))][:int(rng.integers(1, 9))]
            fresh = list(range(next_id, next_id + int(rng.integers(0, 4))))
            next_id += len(fresh)
            ids = base + fresh
            length = len(ids) * 16 - (0 if rng.random() < 0.5 else int(rng.integers(1, 16)))
            row = dict(input_length=length, output_length=int(rng.integers(0, 40)), hash_ids=ids)
        rows.append(dict(row, timestamp=t * 10))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_hash_id_trace(path, block_size=16)


def repeats() -> Workload:
    """Whole requests repeated with explicit outputs (cached output pages: duplicates), a
    salted and an extra-keyed copy (namespaces), prompts shorter than a page, no output."""
    rng = np.random.default_rng(1)
    base = [rng.integers(0, 500, int(rng.integers(1, 70))).tolist() for _ in range(6)]
    outs = [rng.integers(0, 500, int(rng.integers(0, 40))).tolist() for _ in range(6)]
    reqs = []
    for t in range(60):
        i = int(rng.integers(6))
        kw = {}
        if t % 11 == 3:
            kw["cache_salt"] = "s"
        if t % 13 == 5:
            kw["extra_key"] = "lora"
        prompt = base[i] + (outs[i] + base[(i + 1) % 6][:5] if t % 4 == 0 else [])
        reqs.append(TraceRequest(f"r{t}", t, prompt, output=outs[i] if t % 3 else None,
                                 output_len=len(outs[i]), **kw))
    return Workload("repeats", reqs)


def capacities(w, kind, ps) -> list[int]:
    """One page, a token below and at the largest request, log-spaced up past the footprint."""
    foot = lru_hit_curve(w, kind, ps, [None]).footprint_tokens
    need = max(-(-(len(r.prompt) + r.output_len) // ps) * ps for r in w)
    grid = np.geomspace(need, foot * 1.3, 10).astype(int).tolist()
    return sorted({1, ps, need - 1, need, need + ps - 1, *grid})


def build(kind, ps):
    if kind == "radix":
        return CacheConfig("radix", ps, "lru", evict_granularity="page").build()
    return CacheConfig("blockhash", ps).build()


def check_against_replay(w, kind, ps) -> int:
    caps = capacities(w, kind, ps)
    curve = lru_hit_curve(w, kind, ps, caps)
    checked = 0
    for j, c in enumerate(caps):
        try:
            stats = replay(w, build(kind, ps), c)
        except ValueError:
            assert not curve.feasible[j], f"capacity {c}: replay refuses it, the curve does not"
            assert curve.hit_tokens[j] == -1
            continue
        assert curve.feasible[j], f"capacity {c}: the curve calls it infeasible"
        assert curve.capacities[j] == stats.capacity
        assert curve.hit_tokens[j] == stats.hit_tokens, f"{kind} p{ps} capacity {c}"
        assert tuple(curve.hits[:, j].tolist()) == stats.hits, f"{kind} p{ps} capacity {c}"
        checked += 1
    assert checked >= 10 and curve.prompt_tokens == w.num_prompt_tokens
    return checked


@pytest.mark.parametrize("kind,ps", LINES)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_equals_replay_on_generators(name, kind, ps):
    check_against_replay(make_workload(name, **SMALL[name]), kind, ps)


@pytest.mark.parametrize("kind,ps", LINES)
def test_equals_replay_on_hash_id_trace(tmp_path, kind, ps):
    w = hash_trace(tmp_path / "trace.jsonl")
    check_against_replay(w, kind, ps)
    if kind == "blockhash":                       # the trace does exercise duplicate blocks
        assert replay(w, build(kind, ps)).duplicate_blocks > 0


@pytest.mark.parametrize("kind,ps", LINES)
def test_equals_replay_on_repeats(kind, ps):
    check_against_replay(repeats(), kind, ps)


# ---- a page-level reference simulator --------------------------------------------------------

class Reference:
    """replay's request lifecycle at one capacity, page by page. Pages are interned (parent
    page, tokens) ids. radix: a cached page has a last-access time; eviction takes the unlocked
    leaf page of least (time, -depth), i.e. the least recent leaf trimmed from its end.
    blockhash: copies of a content in registration order, an LRU queue of unreferenced copies
    (head evicted first), no dedup on insert."""

    def __init__(self, kind: str, ps: int, pool_pages: int):
        self.kind, self.ps, self.P = kind, ps, pool_pages
        self.ids: dict = {}
        self.parent: dict[int, int] = {}
        self.depth: dict[int, int] = {}
        self.time = 0
        self.cached: dict[int, int] = {}          # radix: page -> last access
        self.kids: dict[int, int] = {}            # radix: page -> cached children
        self.copies: dict[int, list[int]] = {}    # blockhash: content -> copies, oldest first
        self.content: dict[int, int] = {}         # blockhash: copy -> content
        self.ref: dict[int, int] = {}
        self.queue: deque = deque()
        self.serial = 0

    def pages(self, key: RadixKey, n: int) -> list[int]:
        out, parent = [], ("ns", key.namespace)
        for i in range(n):
            pid = self.ids.setdefault((parent, key.page(i, self.ps)), len(self.ids))
            self.parent.setdefault(pid, parent)
            self.depth[pid] = i
            out.append(pid)
            parent = pid
        return out

    def held(self) -> int:
        return len(self.cached) if self.kind == "radix" else len(self.content)

    # radix
    def r_touch(self, pages: list[int]) -> None:
        self.time += 1
        for p in pages:
            if p not in self.cached:
                par = self.parent[p]
                self.kids[par] = self.kids.get(par, 0) + 1
            self.cached[p] = self.time

    def r_evict(self, n: int, locked: set) -> None:
        for _ in range(n):
            leaves = [p for p in self.cached if not self.kids.get(p) and p not in locked]
            p = min(leaves, key=lambda p: (self.cached[p], -self.depth[p]))
            del self.cached[p]
            self.kids[self.parent[p]] -= 1

    # blockhash
    def b_evict(self, n: int) -> None:
        for _ in range(n):
            b = self.queue.popleft()
            self.copies[self.content[b]].remove(b)
            del self.content[b], self.ref[b]

    def b_register(self, contents: list[int]) -> list[int]:
        made = []
        for c in contents:
            self.serial += 1
            self.copies.setdefault(c, []).append(self.serial)
            self.content[self.serial], self.ref[self.serial] = c, 0
            made.append(self.serial)
        self.queue.extend(reversed(made))
        return made

    def b_lock(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1

    def b_unlock(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue.append(b)

    def request(self, key: RadixKey, out_len: int, full: RadixKey) -> int:
        ps, L, T = self.ps, len(key), len(key) + out_len
        M, F, A, n_prompt = (L - 1) // ps, L // ps, T // ps, -(-L // ps)
        b = -(-T // ps) - n_prompt
        path = self.pages(full, A)
        radix = self.kind == "radix"
        h = 0
        while h < M and (path[h] in self.cached if radix else self.copies.get(path[h])):
            h += 1
        private = 0

        def alloc(n: int, locked) -> None:
            short = n - (self.P - self.held() - private)
            if short > 0:
                self.r_evict(short, locked) if radix else self.b_evict(short)

        if radix:
            self.r_touch(path[:h])
            alloc(n_prompt - h, set(path[:h]))
        else:
            chain = [self.copies[c][0] for c in path[:h]]
            self.b_lock(chain)
            alloc(n_prompt - h, None)
        private = n_prompt - h
        if out_len:
            if radix:
                self.r_touch(path[:F])
            else:
                made = self.b_register(path[h:F])
                self.b_lock(chain + made)
                self.b_unlock(chain)
                chain = chain + made
            private = n_prompt - F
            alloc(b, set(path[:F]))
            private += b
        if radix:
            self.r_touch(path[:A])
        else:
            self.b_register(path[F if out_len else h:A])
            self.b_unlock(chain)
        return h * ps


def reference_hits(w, kind, ps, capacity) -> list[int]:
    sim, filler, hits = Reference(kind, ps, capacity // ps), 0, []
    for r in w:
        key = RadixKey(r.prompt, r.extra_key, r.cache_salt)
        out, filler = computed_output(r, filler)       # what a serving engine computes
        hits.append(sim.request(key, len(out), key + RadixKey(out, r.extra_key, r.cache_salt)))
    return hits


@pytest.mark.parametrize("kind,ps", LINES)
def test_equals_reference_simulator(tmp_path, kind, ps):
    for w in (make_workload("multiturn", **SMALL["multiturn"]), hash_trace(tmp_path / "t.jsonl", 50),
              repeats()):
        caps = [c for c in capacities(w, kind, ps) if c >= ps]
        curve = lru_hit_curve(w, kind, ps, caps)
        for j, c in enumerate(caps):
            if curve.feasible[j]:
                assert curve.hits[:, j].tolist() == reference_hits(w, kind, ps, c - c % ps), \
                    f"{w.name} {kind} p{ps} capacity {c}"


def test_result_shape_and_infeasible_capacities():
    w = make_workload("multiturn", **SMALL["multiturn"])
    need = max(-(-(len(r.prompt) + r.output_len) // 16) * 16 for r in w)
    curve = lru_hit_curve(w, "radix", 16, [15, need - 1, need + 15, None])
    assert curve.capacities.tolist() == [0, need - 16, need, curve.footprint_tokens]
    assert curve.feasible.tolist() == [False, False, True, True]
    assert curve.hit_tokens[:2].tolist() == [-1, -1] and (curve.hits[:, :2] == -1).all()
    assert curve.hits.shape == (len(w), 4) and curve.hits.dtype == np.int64
    assert curve.hit_tokens[3] == replay(w, build("radix", 16)).hit_tokens
    assert curve.hit_tokens[2] <= curve.hit_tokens[3]
    assert need <= curve.peak_tokens <= curve.footprint_tokens
    for kind, ps in LINES:                       # the peak is the smallest pool evicting nothing
        peak = lru_hit_curve(w, kind, ps, [None]).peak_tokens
        assert replay(w, build(kind, ps), peak).evicted_tokens == 0
        assert replay(w, build(kind, ps), peak - ps).evicted_tokens > 0
    with pytest.raises(ValueError):
        lru_hit_curve(w, "lfu", 16, [1000])
    with pytest.raises(ValueError):
        lru_hit_curve(w, "radix", 16, [0])
