"""BlockHashCache: exact block ids and free-queue order, the len - 1 rule, namespaces,
orphans, duplicates, equivalence with RadixCache at page = block size, and bad input."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache.base import CacheReq
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.events import chain_hash
from radixkv.cache.manager import CacheManager
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.offline.replay import replay
from radixkv.workloads import make_workload

from tests.cache._helpers import key, toks


def ids(chain) -> list[int]:
    return [b.id for b in chain]


def refs(c: BlockHashCache) -> dict[int, int]:
    return {bid: b.ref_cnt for bid, b in sorted(c.blocks.items())}


def snap(c: BlockHashCache) -> tuple:
    return (sorted((b.id, b.hash, b.parent_hash, b.ref_cnt) for b in c.blocks.values()),
            c.free_queue_ids(), sorted((h, sorted(v)) for h, v in c.by_hash.items()),
            c.duplicate_blocks, c.peak_blocks, c.evictable_size(), c.protected_size())


def serve(c: BlockHashCache, pool: SlotPool, prompt, output=(), ns=(None, None)) -> int:
    """One request as a sequential replay serves it (through a CacheManager); returns its
    hit tokens."""
    mgr = CacheManager(c, pool)
    req = CacheReq(key(list(prompt) + list(output), ns))
    hit = mgr.admit(req, req.key[:len(prompt) - 1], len(req.key))   # the len - 1 rule
    assert hit is not None, "the pool cannot hold the request"
    mgr.cache_req(req, finished=True)
    return hit


# ---- the scripted sequence -----------------------------------------------------------------
@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_scripted_miss_hit_in_use_hit_after_free_miss_after_eviction(algo):
    c, pool = BlockHashCache(block_size=4, hash_algo=algo), SlotPool(32, page_size=4)
    A, B, C = toks(0, 12) + [900], toks(0, 8) + toks(100, 5), toks(0, 12) + [200]

    # A misses; its 3 full blocks get ids 0, 1, 2 (the pool hands out low pages first)
    m = c.lookup(key(A))
    assert (m.prefix_len, m.last_node) == (0, ())
    new = pool.alloc(len(A))
    assert new.tolist() == list(range(16))
    res = c.insert(key(A), new[:len(A)])
    assert res.prefix_len == 0 and ids(res.last_node) == [0, 1, 2]
    assert c.free_queue_ids() == [2, 1, 0]                 # unreferenced, last block first
    pool.free(new[12:])                                   # the partial block's page
    c.inc_lock_ref(res.last_node)                         # A is running
    a_chain = res.last_node
    assert c.free_queue_ids() == [] and refs(c) == {0: 1, 1: 1, 2: 1}

    # B hits A's first two blocks while A is still running: ref counts 2
    m = c.lookup(key(B))
    assert m.prefix_len == 8 and ids(m.last_node) == [0, 1] and m.slots.tolist() == list(range(8))
    c.inc_lock_ref(m.last_node)
    assert refs(c) == {0: 2, 1: 2, 2: 1} and c.free_queue_ids() == []
    new = pool.alloc(len(B) - 8)
    assert new.tolist() == list(range(12, 20))            # page 3 (freed above) then page 4
    slots = np.concatenate([m.slots, new])
    res = c.insert(key(B), slots[:len(B)])
    assert res.prefix_len == 8 and ids(res.last_node) == [0, 1, 3]
    assert c.free_queue_ids() == [3]
    pool.free(slots[12:])
    c.dec_lock_ref(m.last_node)                           # B finishes; A still holds 0, 1
    assert refs(c) == {0: 1, 1: 1, 2: 1, 3: 0} and c.free_queue_ids() == [3]

    # A finishes: its blocks reach the tail last block first
    c.dec_lock_ref(a_chain)
    assert refs(c) == {0: 0, 1: 0, 2: 0, 3: 0} and c.free_queue_ids() == [3, 2, 1, 0]

    # C hits all of A's blocks from the free queue; a hit takes them out, the finish puts
    # them back at the tail in reverse order
    m = c.lookup(key(C))
    assert m.prefix_len == 12 and ids(m.last_node) == [0, 1, 2]
    c.inc_lock_ref(m.last_node)
    assert c.free_queue_ids() == [3] and refs(c) == {0: 1, 1: 1, 2: 1, 3: 0}
    new = pool.alloc(1)
    assert new.tolist() == list(range(16, 20))
    slots = np.concatenate([m.slots, new])
    res = c.insert(key(C), slots[:len(C)])
    assert res.prefix_len == 12 and ids(res.last_node) == [0, 1, 2]
    pool.free(slots[12:])
    c.dec_lock_ref(m.last_node)
    assert c.free_queue_ids() == [3, 2, 1, 0]
    pool.check_conservation(c.held_slots())

    # eviction pops the head: B's leaf, then A's last block; C now hits only two blocks
    freed = c.evict(8)
    assert freed.tolist() == list(range(12, 16)) + list(range(8, 12))
    pool.free(freed)
    assert c.free_queue_ids() == [1, 0] and c.lookup(key(C)).prefix_len == 8
    freed = c.evict(100)
    assert freed.tolist() == list(range(4, 8)) + list(range(0, 4))
    pool.free(freed)
    assert c.free_queue_ids() == [] and c.num_blocks() == 0
    m = c.lookup(key(A))
    assert (m.prefix_len, m.last_node) == (0, ())
    assert pool.available() == 32
    pool.check_conservation(c.held_slots())
    c.check_invariants()


def test_len_minus_one_rule():
    c = BlockHashCache(block_size=4)
    c.insert(key(toks(0, 8)), np.arange(8))
    assert c.lookup(key(toks(0, 8))).prefix_len == 4          # exactly 2 blocks: only 1 hits
    assert ids(c.lookup(key(toks(0, 8))).last_node) == [0]
    assert c.lookup(key(toks(0, 9))).prefix_len == 8          # 2 blocks + 1 token: both hit
    assert c.match_prefix(key(toks(0, 8))).prefix_len == 8    # no rule without lookup
    assert c.lookup(key(toks(0, 5))).prefix_len == 4
    assert c.lookup(key(toks(0, 4))).prefix_len == 0
    assert c.lookup(key([])).prefix_len == 0


def test_namespace_isolation_and_salt_chains_through_every_block():
    c = BlockHashCache(block_size=4)
    T = toks(0, 12)
    c.insert(key(T), np.arange(12))
    assert c.lookup(key(T + [1])).prefix_len == 12
    assert c.lookup(key(T + [1], ns=(None, "tenant-a"))).prefix_len == 0
    assert c.lookup(key(T + [1], ns=("lora-1", None))).prefix_len == 0
    plain, salted = c.block_hashes(key(T)), c.block_hashes(key(T, ns=(None, "tenant-a")))
    assert len(salted) == 3 and set(plain).isdisjoint(salted)
    # the salt enters the first block only; later blocks differ through the chain alone
    k = key(T)
    assert salted[0] == chain_hash(None, (None, "tenant-a"), k.page(0, 4))
    assert salted[1] == chain_hash(salted[0], (None, None), k.page(1, 4))
    assert salted[2] == chain_hash(salted[1], (None, None), k.page(2, 4))
    lora = c.block_hashes(key(T, ns=("lora-1", None)))
    assert lora[1] == chain_hash(lora[0], ("lora-1", None), k.page(1, 4))   # extra key: every block


def test_finished_request_blocks_go_to_the_tail_in_reverse_order():
    c, pool = BlockHashCache(block_size=4), SlotPool(64, page_size=4)
    mgr = CacheManager(c, pool)
    serve(c, pool, toks(500, 8))                               # an older entry: blocks 0, 1
    assert c.free_queue_ids() == [1, 0]
    req = CacheReq(key=key(toks(0, 18)))                        # blocks 2..5 + a partial page
    assert mgr.admit(req, req.key[:0], 18) == 0
    assert mgr.cache_req(req, finished=True).tolist() == list(range(24, 28))
    assert c.free_queue_ids() == [1, 0, 5, 4, 3, 2]
    # a later request that hit the first two blocks: all its blocks return reversed
    P = toks(0, 8) + toks(50, 9)
    assert ids(c.lookup(key(P)).last_node) == [2, 3]
    req = CacheReq(key=key(P))
    assert mgr.admit(req, req.key[:-1], len(P)) == 8 and ids(req.last_node) == [2, 3]
    mgr.cache_req(req, finished=True)
    assert c.free_queue_ids() == [1, 0, 5, 4, 7, 6, 3, 2]         # new 6, 7; then 3, 2
    mgr.check()


# ---- orphans and duplicates ----------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_no_orphans_under_normal_flow(seed):
    rng = np.random.default_rng(seed)
    c, pool = BlockHashCache(block_size=4), SlotPool(256, page_size=4)
    seqs: list[list[int]] = [toks(0, 60)]
    for _ in range(400):
        base = seqs[rng.integers(len(seqs))]
        cut = int(rng.integers(1, len(base) + 1))
        prompt = (base[:cut] + rng.integers(0, 3, rng.integers(0, 40)).tolist())[:200]
        output = rng.integers(0, 3, rng.integers(0, 9)).tolist()
        serve(c, pool, prompt, output)
        seqs.append(prompt + output)
        assert c.stats()["orphan_blocks"] == 0
        c.check_invariants()
        pool.check_conservation(c.held_slots())
    assert c.peak_blocks == 64 and c.duplicate_blocks > 0       # eviction and duplicates ran


def test_forward_order_free_creates_orphans():
    c = BlockHashCache(block_size=4)
    P = toks(0, 12) + [7]
    chain = c.insert(key(P), np.arange(13)).last_node
    c.inc_lock_ref(chain)
    for b in chain:                                           # parent first, on purpose
        c.dec_lock_ref((b,))
    assert c.free_queue_ids() == [0, 1, 2]
    assert c.evict(1).tolist() == [0, 1, 2, 3]                # the root block goes first
    assert c.stats()["orphan_blocks"] == 1 and c.num_blocks() == 2     # block 1 lost its parent
    assert c.lookup(key(P)).prefix_len == 0                   # cached but unreachable
    c.evict(1)
    assert c.stats()["orphan_blocks"] == 1 and ids(c.blocks.values()) == [2]
    c.evict(1)
    assert c.stats()["orphan_blocks"] == 0 and c.num_blocks() == 0
    c.check_invariants()


def test_duplicate_blocks_when_two_requests_miss_the_same_prefix():
    c, pool = BlockHashCache(block_size=4), SlotPool(64, page_size=4)
    P = toks(0, 8) + [99]
    ma, mb = c.lookup(key(P)), c.lookup(key(P))               # both miss: nothing cached yet
    assert ma.prefix_len == mb.prefix_len == 0
    sa, sb = pool.alloc(len(P)), pool.alloc(len(P))
    ra = c.insert(key(P), sa[:len(P)])
    rb = c.insert(key(P), sb[:len(P)])
    assert (ra.prefix_len, rb.prefix_len) == (0, 0)           # B's blocks are not duplicates to free
    assert ids(ra.last_node) == [0, 1] and ids(rb.last_node) == [3, 4]
    assert c.duplicate_blocks == 2 and c.num_blocks() == 4
    assert sorted(len(v) for v in c.by_hash.values()) == [2, 2]
    assert c.free_queue_ids() == [1, 0, 4, 3]
    assert ids(c.lookup(key(P + [1])).last_node) == [0, 1]   # the first copy serves hits
    pool.free(np.concatenate([sa[8:], sb[8:]]))
    pool.check_conservation(c.held_slots())
    c.check_invariants()


# ---- equivalence with the radix tree -------------------------------------------------------
SMALL = {
    "support": dict(num_users=8, turns=3, system_len=100, fewshot_len=150, rag_len=200,
                    msg_len=(5, 40), reply_len=(5, 60)),
    "fewshot": dict(num_questions=40, preamble_len=300, question_len=(5, 50), output_len=(0, 30)),
    "multiturn": dict(num_users=8, turns=4, system_len=37, msg_len=(5, 40), reply_len=(0, 50)),
    "rag": dict(num_requests=40, num_docs=10, doc_len=100, system_len=30,
                question_len=(5, 30), output_len=(0, 30)),
}


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("bs", [16, 7])
def test_hits_equal_radix_at_page_size_block_size(name, bs):
    w = make_workload(name, **SMALL[name])
    radix = replay(w, RadixCache(page_size=bs))
    blocks = replay(w, BlockHashCache(block_size=bs), check=True)
    assert blocks.hits == radix.hits and blocks.hit_tokens > 0
    assert blocks.orphan_blocks == 0


# ---- bad input -----------------------------------------------------------------------------
def _populated():
    c = BlockHashCache(block_size=4)
    chain = c.insert(key(toks(0, 8)), np.arange(8)).last_node
    c.insert(key(toks(100, 8)), np.arange(8, 16))
    c.inc_lock_ref(chain[:1])
    return c, chain


BAD = {
    "not whole blocks": lambda c, ch: c.insert(key(toks(0, 8)), np.arange(1, 9)),
    "wrong slot count": lambda c, ch: c.insert(key(toks(0, 8)), np.arange(16, 23)),
    "negative slots": lambda c, ch: c.insert(key(toks(50, 8)), np.arange(-8, 0)),
    "ids hold other content": lambda c, ch: c.insert(key(toks(50, 8)), np.arange(0, 8)),
    "unreferenced block": lambda c, ch: c.dec_lock_ref(ch[1:]),
    "one ref listed twice": lambda c, ch: c.dec_lock_ref((ch[0], ch[0])),
    "not a tuple": lambda c, ch: c.dec_lock_ref([ch[0]]),
    "not blocks": lambda c, ch: c.inc_lock_ref((ch[0], "x")),
    "evict -1": lambda c, ch: c.evict(-1),
    "evict 1.5": lambda c, ch: c.evict(1.5),
    "evict True": lambda c, ch: c.evict(True),
}


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_bad_input_raises_and_changes_nothing(bad):
    c, chain = _populated()
    before = snap(c)
    with pytest.raises((ValueError, TypeError)):
        bad(c, chain)
    assert snap(c) == before
    c.check_invariants()


def test_evicted_chain_is_rejected():
    c, chain = _populated()
    c.dec_lock_ref(chain[:1])
    c.evict(100)
    with pytest.raises(ValueError, match="no longer cached"):
        c.inc_lock_ref(chain)
    assert c.num_blocks() == 0 and c.free_queue_ids() == []


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="block_size"):
        BlockHashCache(block_size=0)
    with pytest.raises(ValueError, match="md5"):
        BlockHashCache(hash_algo="md5")


# ---- the trie index against a naive hash chain -----------------------------------------------
# The cache finds blocks in a trie of block contents instead of a hash table. The reference
# below is vLLM's block pool done naively: chained sha256 hashes (computed here, with the
# salt in the first block and the extra key in every block), hash -> block ids oldest first,
# and the LRU free queue as a list. Every answer and every piece of state must agree.
from hypothesis import HealthCheck, settings                                      # noqa: E402
from hypothesis import strategies as st                                            # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

from radixkv.cache.blockhash import Chain                                  # noqa: E402
from radixkv.cache.events import KVEvent                                           # noqa: E402
from radixkv.cache.key import RadixKey                                             # noqa: E402

NAMESPACES = [(None, None), ("lora", None), (None, "salt"), ("lora", "salt")]
NUM_BLOCKS = 24


def chained(key: RadixKey, bs: int, algo: str = "sha256") -> list[int]:
    out, parent = [], None
    for i in range(len(key) // bs):
        parent = chain_hash(parent, key.namespace if i == 0 else (key.namespace[0], None),
                            key.page(i, bs), algo)
        out.append(parent)
    return out


class HashChainPool:
    """vLLM's prefix cache, naively: blocks {id: [hash, parent hash, ref]}, by_hash {hash: ids}."""

    def __init__(self, bs: int):
        self.bs, self.blocks, self.by_hash, self.queue, self.dups = bs, {}, {}, [], 0

    def match(self, key: RadixKey) -> list[int]:
        ids = []
        for h in chained(key, self.bs):
            if h not in self.by_hash:
                break
            ids.append(self.by_hash[h][0])
        return ids

    def insert(self, key: RadixKey, ids: list[int]) -> int:
        new, prefix, parent = [], 0, None
        for i, (bid, h) in enumerate(zip(ids, chained(key, self.bs))):
            if bid in self.blocks:
                prefix = prefix if new else i + 1
            else:
                self.dups += h in self.by_hash
                self.blocks[bid] = [h, parent, 0]
                self.by_hash.setdefault(h, []).append(bid)
                new.append(bid)
            parent = h
        self.queue += new[::-1]
        return prefix

    def lock(self, ids: list[int]) -> None:
        for b in ids:
            if self.blocks[b][2] == 0:
                self.queue.remove(b)
            self.blocks[b][2] += 1

    def unlock(self, ids: list[int]) -> None:
        for b in reversed(ids):
            self.blocks[b][2] -= 1
            if self.blocks[b][2] == 0:
                self.queue.append(b)

    def evict(self, num_tokens: int) -> list[int]:
        out = []
        while len(out) * self.bs < num_tokens and self.queue:
            b = self.queue.pop(0)
            h = self.blocks.pop(b)[0]
            self.by_hash[h].remove(b)
            if not self.by_hash[h]:
                del self.by_hash[h]
            out.append(b)
        return out

    def orphans(self) -> int:
        return sum(1 for _, p, _ in self.blocks.values() if p is not None and p not in self.by_hash)


class IndexMachine(RuleBasedStateMachine):
    """Random inserts (extending a match, or all-fresh: duplicates), pure and splitting matches,
    locks, whole and block-by-block forward unlocks (orphans), evictions, over four namespaces."""

    @initialize(bs=st.sampled_from([1, 2, 4]))
    def setup(self, bs):
        self.bs, self.c, self.ref = bs, BlockHashCache(block_size=bs), HashChainPool(bs)
        self.free = list(range(NUM_BLOCKS))              # block ids not cached
        self.held: list[tuple] = []                      # (handle, ids) locked in both
        self.memo: list[tuple] = []                      # (key, prefix, ids, last_node, stamp)

    def _key(self, ns, toks) -> RadixKey:
        return RadixKey(toks, *NAMESPACES[ns])

    def _slots(self, ids, n_tokens) -> np.ndarray:
        whole = (np.array(ids, np.int64)[:, None] * self.bs + np.arange(self.bs)).ravel()
        tail = 10_000 + np.arange(n_tokens - len(whole))          # a partial last page: not stored
        return np.concatenate([whole, tail]).astype(np.int64)

    def _lock(self, handle, ids) -> None:
        self.c.inc_lock_ref(handle)
        self.ref.lock(ids)
        self.held.append((handle, ids))

    @rule(ns=st.integers(0, 3), toks=st.lists(st.integers(0, 2), max_size=10), fresh=st.booleans(),
          lock=st.booleans())
    def insert(self, ns, toks, fresh, lock):
        key = self._key(ns, toks)
        cached = [] if fresh else self.ref.match(key)
        need = len(key) // self.bs - len(cached)
        if need > len(self.free):
            return
        ids = cached + [self.free.pop(0) for _ in range(need)]
        res = self.c.insert(key, self._slots(ids, len(key)))
        assert res.prefix_len == self.ref.insert(key, ids) * self.bs
        assert [b.id for b in res.last_node] == ids
        if lock and ids:
            self._lock(res.last_node, ids)

    @rule(ns=st.integers(0, 3), toks=st.lists(st.integers(0, 2), max_size=10), split=st.booleans(),
          lock=st.booleans())
    def match(self, ns, toks, split, lock):
        key = self._key(ns, toks)
        m, ids = self.c.match_prefix(key, split=split), self.ref.match(key)
        assert m.prefix_len == len(ids) * self.bs and [b.id for b in m.last_node] == ids
        assert m.slots.tolist() == self._slots(ids, len(ids) * self.bs).tolist()
        self.memo.append((key, m.prefix_len, ids, m.last_node, self.c.admission().stamp(m.last_node)))
        if lock and ids:
            self._lock(m.last_node, ids)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100), forward=st.booleans())
    def unlock(self, i, forward):
        handle, ids = self.held.pop(i % len(self.held))
        if forward:                                      # parent first: leaves orphans behind
            for b, bid in zip(handle, ids):
                self.c.dec_lock_ref((b,))
                self.ref.unlock([bid])
        else:
            self.c.dec_lock_ref(handle)
            self.ref.unlock(ids)

    @rule(n=st.integers(0, 4 * 4))
    def evict(self, n):
        freed, ids = self.c.evict(n), self.ref.evict(n)
        assert freed.tolist() == self._slots(ids, len(ids) * self.bs).tolist()
        self.free += ids

    @invariant()
    def agrees_with_the_hash_chain(self):
        c, ref = self.c, self.ref
        c.check_invariants()
        assert c.free_queue_ids() == ref.queue
        assert {b: blk.ref_cnt for b, blk in c.blocks.items()} == {b: v[2] for b, v in ref.blocks.items()}
        assert {h: list(v) for h, v in c.by_hash.items()} == ref.by_hash
        assert {b: (blk.hash, blk.parent_hash) for b, blk in c.blocks.items()} == \
            {b: (h, p) for b, (h, p, _) in ref.blocks.items()}
        assert (c.stats()["orphan_blocks"], c.duplicate_blocks) == (ref.orphans(), ref.dups)
        assert c.evictable_size() == self.bs * len(ref.queue)
        assert c.total_size() == self.bs * len(ref.blocks)

    @invariant()
    def a_valid_stamp_is_never_stale(self):
        for memo_key, prefix, ids, node, stamp in self.memo:
            if self.c.admission().still_valid(node, stamp):
                m = self.c.match_prefix(memo_key, split=False)
                assert (m.prefix_len, [b.id for b in m.last_node]) == (prefix, ids)
                assert all(a is b for a, b in zip(m.last_node, node))


IndexMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestIndexMachine = IndexMachine.TestCase


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_events_carry_the_chained_hashes(algo):
    c = BlockHashCache(block_size=4, hash_algo=algo, enable_events=True)
    T = toks(0, 12)
    want: list[KVEvent] = []
    for bid0, ns in zip((0, 3, 6, 9), NAMESPACES):
        k = key(T + [1], ns)
        c.insert(k, np.arange(bid0 * 4, bid0 * 4 + 13))
        hs = chained(k, 4, algo)
        want += [KVEvent("stored", h, p, tuple(T[i * 4:i * 4 + 4]), ns)
                 for i, (h, p) in enumerate(zip(hs, [None] + hs[:-1]))]
    # a chain extended later chains on the cached block's hash; a duplicate repeats the hashes
    k = key(T + toks(50, 4))
    c.insert(k, np.concatenate([np.arange(12), np.arange(48, 52)]))
    c.insert(key(T[:4]), np.arange(52, 56))
    hs = chained(k, 4, algo)
    want += [KVEvent("stored", hs[3], hs[2], tuple(toks(50, 4)), (None, None)),
             KVEvent("stored", hs[0], None, tuple(T[:4]), (None, None))]
    assert c.events().take() == want
    order = c.free_queue_ids()
    hash_of = {b: blk.hash for b, blk in c.blocks.items()}
    c.evict(1000)
    assert c.events().take() == [KVEvent("removed", hash_of[b]) for b in order]
    assert sorted(set(hash_of.values())) == sorted({e.block_hash for e in want})
    c.check_invariants()


def test_stamp_changes_exactly_when_blocks_are_registered_or_dropped():
    c = BlockHashCache(block_size=4)
    c.insert(key(toks(0, 8)), np.arange(8))
    m = c.match_prefix(key(toks(0, 12)), split=False)
    stamp = c.admission().stamp(m.last_node)

    def valid():
        return c.admission().still_valid(m.last_node, stamp)
    c.inc_lock_ref(m.last_node)                           # ref counts and queue order: no change
    c.dec_lock_ref(m.last_node)
    c.insert(key(toks(0, 8)), np.arange(8))                # nothing new registered
    c.evict(0)
    assert valid() and c.match_prefix(key(toks(0, 12))).prefix_len == 8
    c.insert(key(toks(0, 12)), np.arange(12))              # block 2 registered: the match grows
    assert not valid() and c.match_prefix(key(toks(0, 12))).prefix_len == 12
    stamp = c.admission().stamp(m.last_node)
    c.insert(key(toks(500, 4)), np.arange(40, 44))         # elsewhere, still a registration
    assert not valid()
    stamp = c.admission().stamp(m.last_node)
    assert c.free_queue_ids() == [1, 0, 2, 10]
    c.evict(4)                                             # the queue's head: block 1 goes
    assert not valid() and c.match_prefix(key(toks(0, 12))).prefix_len == 4
    stamp = c.admission().stamp(m.last_node)
    c.reset()
    assert not valid()


def test_handles_are_tuples_of_blocks_and_go_stale_with_their_registration():
    c = BlockHashCache(block_size=4)
    chain = c.insert(key(toks(0, 12)), np.arange(12)).last_node
    assert isinstance(chain, Chain) and chain == tuple(chain) and chain[:1] + chain[1:] == tuple(chain)
    assert ids(chain) == [0, 1, 2] and chain[0] is list(chain)[0] is c.blocks[0]
    assert c.match_prefix(key(toks(0, 12))).last_node == chain
    c.evict(100)
    c.insert(key(toks(0, 12)), np.arange(12))              # same ids, same content: a new registration
    with pytest.raises(ValueError, match="no longer cached"):
        c.inc_lock_ref(chain)
    with pytest.raises(ValueError, match="no longer cached"):
        c.inc_lock_ref(tuple(chain))
    assert c.match_prefix(key(toks(0, 12))).last_node != chain
    c.check_invariants()


def test_the_index_holds_no_collected_object_per_block():
    import gc
    c = BlockHashCache(block_size=4)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(50):                                    # 50 chains of 40 blocks, half shared
        c.insert(key(toks(0, 80) + toks(1000 * (i + 1), 80)), np.arange(i * 160, i * 160 + 160))
    gc.collect()
    assert c.num_blocks() == 50 * 40 and len(gc.get_objects()) - before < 100
    c.check_invariants()


def test_page_slots_are_whole_pages_from_the_table_and_past_it(monkeypatch):
    import radixkv.cache.pool as pool
    pages = np.array([5, 0, 3, 70_000], np.int64)
    want = ((pages * 16)[:, None] + np.arange(16)).ravel()
    assert pool.page_slots(pages, 16).tolist() == want.tolist()           # the table grows
    monkeypatch.setattr(pool, "_ROWS_CAP", 1024)                           # past the cap: arithmetic
    assert pool.page_slots(pages * 10, 16).tolist() == (want + (pages * 9 * 16).repeat(16)).tolist()


def test_free_queue_pops_past_stale_entries_in_order():
    c = BlockHashCache(block_size=4)
    for i in range(40):                                    # 40 one-block chains, all in the queue
        c.insert(key(toks(100 * i, 4)), np.arange(4 * i, 4 * i + 4))
    held = [c.match_prefix(key(toks(100 * i, 4))).last_node for i in range(0, 40, 3)]
    for h in held:                                         # their queue entries go stale
        c.inc_lock_ref(h)
    order = c.free_queue_ids()
    want = np.concatenate([np.arange(4 * b, 4 * b + 4) for b in order[:10]])
    assert c.evict(4 * 10).tolist() == want.tolist()
    assert c.free_queue_ids() == order[10:]
    c.check_invariants()
