"""Sequential replay: slot conservation, the radix-vs-blockhash arithmetic, the CLI, capacity
parsing and errors, and the Mooncake trace's hit rate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.nocache import NoCache
from radixkv.cache.radix import RadixCache
from radixkv.cli import main
from radixkv.config import CacheConfig
from radixkv.offline.replay import replay
from radixkv.argcheck import parse_capacity
from radixkv.workloads import TraceRequest, Workload, load_workload, make_workload

MOONCAKE = Path(__file__).resolve().parents[2].parent / "shared/traces/mooncake/synthetic_trace.jsonl"
SMALL = {
    "support": dict(num_users=6, turns=3, system_len=100, fewshot_len=150, rag_len=200,
                    msg_len=(5, 40), reply_len=(5, 60)),
    "multiturn": dict(num_users=6, turns=4, system_len=20, msg_len=(5, 40), reply_len=(0, 50)),
    "rag": dict(num_requests=30, num_docs=8, doc_len=100, system_len=30, question_len=(5, 30),
                output_len=(0, 30)),
}
CACHES = {"radix-p1": lambda: RadixCache(), "radix-p16": lambda: RadixCache(page_size=16),
          "blockhash": lambda: BlockHashCache(block_size=16), "none": lambda: NoCache()}


@pytest.mark.parametrize("capacity", [None, 600])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_workloads_conserve_slots(name, capacity):
    w = make_workload(name, **SMALL[name])
    stats = {c: replay(w, make(), capacity, check=True) for c, make in CACHES.items()}
    for s in stats.values():
        assert s.requests == len(w) and s.prompt_tokens == w.num_prompt_tokens
        assert s.hit_rate == pytest.approx(s.hit_tokens / s.prompt_tokens)
        assert s.orphan_blocks == 0 and s.cpu_us_per_request > 0
    assert stats["none"].hit_rate == 0 and stats["none"].evicted_tokens == 0
    if capacity is None:                         # under pressure the eviction orders differ
        assert stats["radix-p1"].hit_tokens >= stats["blockhash"].hit_tokens > 0
        assert all(s.evicted_tokens == 0 for s in stats.values())
        assert all(a >= b for a, b in zip(stats["radix-p1"].hits, stats["blockhash"].hits))
    else:
        assert stats["radix-p1"].evicted_tokens > 0 and stats["blockhash"].evicted_tokens > 0


def test_radix_advantage_is_block_granularity_on_support():
    """Unlimited capacity: every request diverges from the cache at one point, and a radix
    tree at page 1 keeps the up to 15 tokens past the last whole 16-token block there."""
    w = make_workload("support", num_users=20, turns=5)
    radix, blocks = replay(w, RadixCache()), replay(w, BlockHashCache(block_size=16))
    diffs = [r - b for r, b in zip(radix.hits, blocks.hits)]
    assert min(diffs) >= 0 and max(diffs) <= 15
    assert radix.hit_tokens - blocks.hit_tokens == sum(diffs)
    print(f"\nsupport 20x5: {radix.requests} requests, {radix.prompt_tokens:,} prompt tokens; "
          f"radix p1 hits {radix.hit_tokens:,} ({radix.hit_rate:.4f}), blockhash b16 hits "
          f"{blocks.hit_tokens:,} ({blocks.hit_rate:.4f}); difference {sum(diffs):,} = "
          f"{sum(diffs) / len(diffs):.2f} tokens/request, max {max(diffs)}")
    radix16 = replay(w, RadixCache(page_size=16))
    assert radix16.hits == blocks.hits and radix16.hit_tokens == blocks.hit_tokens


def test_filler_outputs_create_no_sharing():
    P = list(range(1, 41))
    reqs = [TraceRequest("a", 0, P, output_len=5), TraceRequest("b", 1, P, output_len=5),
            TraceRequest("c", 2, P + [7, 8, 9], output_len=0)]
    s = replay(Workload("w", reqs), RadixCache(), check=True)
    assert s.hits == (0, 39, 40)                         # the len - 1 rule, then the prompt only
    # root, P[:39] and [P[39]] (split by b's match), the two distinct filler leaves, c's leaf
    assert s.peak_nodes == 6


def test_namespaces_are_replayed():
    P = list(range(100))
    reqs = [TraceRequest("a", 0, P, output=[1]), TraceRequest("b", 1, P, output=[1], cache_salt="s"),
            TraceRequest("c", 2, P, output=[1], extra_key="lora")]
    for make in CACHES.values():
        assert replay(Workload("w", reqs), make(), check=True).hit_tokens == 0


def test_capacity_smaller_than_one_request():
    w = make_workload("support", **SMALL["support"])
    biggest = max(len(r.prompt) + r.output_len for r in w)
    with pytest.raises(ValueError, match=f"capacity {biggest - 1:,} tokens is smaller than one "
                                         f"request: .* needs {biggest:,}"):
        replay(w, RadixCache(), capacity=biggest - 1)
    assert replay(w, RadixCache(), capacity=biggest, check=True).evicted_tokens > 0
    with pytest.raises(ValueError, match="smaller than one request"):
        replay(w, BlockHashCache(block_size=16), capacity=biggest + 1)     # page rounding
    with pytest.raises(ValueError, match="one page of 16"):
        replay(w, BlockHashCache(block_size=16), capacity=15)


def test_parse_capacity():
    assert parse_capacity("3000000") == parse_capacity("3_000_000") == 3_000_000
    assert parse_capacity("3,000,000") == parse_capacity(3_000_000) == 3_000_000
    assert parse_capacity("40GiB", kv_bytes_per_token=327_680) == 131_072
    assert parse_capacity("1.5 GB", kv_bytes_per_token=1000) == 1_500_000
    assert parse_capacity("1000 B", kv_bytes_per_token=3) == 333
    for text, kv, msg in [("40GiB", None, "kv-bytes-per-token"), ("abc", None, "'abc'"),
                          ("0", None, "less than one token"), ("1.5", None, "whole number"),
                          ("10 parsecs", None, "unknown unit 'parsecs'"),
                          ("1B", 2, "less than one token"), ("-5", None, "'-5'"),
                          ("1GiB", 0, "kv_bytes_per_token")]:
        with pytest.raises(ValueError, match=msg):
            parse_capacity(text, kv)


def test_build_cache_names():
    assert isinstance(CacheConfig("radix", page_size=4).build(), RadixCache)
    assert CacheConfig("blockhash", 8, hash_algo="xxhash").build().block_size == 8
    with pytest.raises(ValueError, match="unknown cache 'lru'; valid: radix, blockhash, none"):
        CacheConfig("lru")
    with pytest.raises(ValueError, match="unknown eviction policy 'old'"):
        CacheConfig("radix", eviction="old")
    assert CacheConfig("radix").label == "radix p1 lru"               # page eviction: the default
    assert CacheConfig("radix", evict_granularity="node").label == "radix p1 lru node-evict"
    for cfg in (CacheConfig("radix", 4, "lfu"), CacheConfig("blockhash", 8, hash_algo="xxhash"),
                CacheConfig("radix", 16, "slru", evict_granularity="page"),
                CacheConfig("none"), CacheConfig("none", 2)):
        assert cfg.label == cfg.build().label


# ---- the command line ----------------------------------------------------------------------
def test_cli_replay_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["replay", "support", "--cache", "radix", "blockhash", "none", "--limit", "300",
               "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for word in ("workload support: 300 requests", "KV pool: unlimited", "hit rate",
                 "peak nodes/blocks", "CPU µs/request", "radix p1 lru", "none"):
        assert word in text
    rows = json.loads(out.read_text())["results"]
    keys = {"cache", "requests", "prompt_tokens", "hit_tokens", "hit_rate", "evicted_tokens",
            "orphan_blocks", "cpu_us_per_request"}
    assert [r["cache"] for r in rows] == ["radix", "blockhash", "none"]
    for r in rows:
        assert keys <= set(r) and r["requests"] == 300 and r["evicted_tokens"] == 0
        assert r["hit_rate"] == pytest.approx(r["hit_tokens"] / r["prompt_tokens"])
        assert r["orphan_blocks"] == 0 and r["cpu_us_per_request"] > 0
    radix, blocks, none = rows
    assert radix["prompt_tokens"] == blocks["prompt_tokens"] == none["prompt_tokens"]
    assert radix["hit_tokens"] >= blocks["hit_tokens"] > 0 and none["hit_tokens"] == 0


def test_cli_replay_capacity_and_trace_file(tmp_path, capsys):
    from radixkv.workloads import write_jsonl
    path = tmp_path / "w.jsonl"
    write_jsonl(make_workload("multiturn", **SMALL["multiturn"]), path)
    out = tmp_path / "r.json"
    assert main(["replay", str(path), "--cache", "radix", "blockhash", "--max-total-tokens",
                 "1_000", "--radix-eviction-policy", "fifo", "--prefix-caching-hash-algo",
                 "xxhash", "--json", str(out)]) == 0
    assert "KV pool: 1_000 = 1,000 tokens" in capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert [r["label"] for r in rows] == ["radix p1 fifo", "blockhash b16 xxhash"]
    assert all(r["evicted_tokens"] > 0 for r in rows)
    assert [r["capacity"] for r in rows] == [1000, 992]             # whole blocks of 16


@pytest.mark.parametrize("args, msg", [
    (["--cache", "radix", "lru"], "--cache: unknown cache 'lru'; valid: radix, blockhash, none"),
    (["--radix-eviction-policy", "oldest"],
     "--radix-eviction-policy: unknown eviction policy 'oldest'; valid: lru"),
    (["--max-total-tokens", "12x"], "--max-total-tokens: bad capacity '12x'"),
    (["--max-total-tokens", "40GiB"], "'40GiB' is a byte size"),
    (["--max-total-tokens", "1000"], "capacity 1,000 tokens is smaller than one request"),
    (["--prefix-caching-hash-algo", "md5"], "--prefix-caching-hash-algo: unknown hash 'md5'"),
    (["--page-size", "0"], "--page-size must be a positive int, got 0"),
    (["--block-size", "0"], "--block-size must be a positive int, got 0"),
])
def test_cli_bad_arguments_exit_2(args, msg, capsys):
    assert main(["replay", "support", "--limit", "20", *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.startswith("radixkv replay: error:")


def test_cli_missing_file_and_bad_int(tmp_path, capsys):
    missing = str(tmp_path / "nope.jsonl")
    assert main(["replay", missing]) == 2
    assert repr(missing) in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["replay", "support", "--limit", "many"])
    assert e.value.code == 2 and "'many'" in capsys.readouterr().err


# ---- the real trace ------------------------------------------------------------------------
@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"{MOONCAKE} is absent")
def test_mooncake_unlimited_radix_hit_rate():
    w = load_workload(MOONCAKE)
    s = replay(w, RadixCache())
    assert s.requests == 3993 and s.evicted_tokens == 0
    assert abs(s.hit_rate - 0.64) <= 0.02, s


def test_capacity_in_scientific_notation():
    # "--kv-capacity 1e11" was refused as malformed; it is a token count like any other
    assert parse_capacity("1e11") == 10**11 and parse_capacity("3E6") == 3_000_000
    assert parse_capacity("1.5e3") == 1500 and parse_capacity("2e1GiB", 2**20) == 20 * 2**10
    for bad, msg in [("1.5e0", "whole number"), ("1e", "unknown unit 'e'"), ("e5", "'e5'")]:
        with pytest.raises(ValueError, match=msg):
            parse_capacity(bad)

