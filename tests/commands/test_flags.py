"""One set of flags, generated from the config dataclasses: the same names, help and defaults in
every subcommand, old spellings as hidden aliases, configs built one way, and the trace flags."""
from __future__ import annotations

import dataclasses
import json

import pytest

from radixkv import __version__
from radixkv.commands.flags import (CACHE_FLAGS, ENGINE_FLAGS, SCHED_FLAGS, configs_from_args,
                                    parse_config_spec)
from radixkv.commands.inputs import load_from_args
from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.sim.specs import MODEL_SPECS
from radixkv.offline.simulate import REFERENCE

from ._helpers import SMALL, hash_id_trace, parse, run, write_lines

SCHED_OPTIONS = {cf.flag for n, cf in SCHED_FLAGS.items() if n != "seed"}
CACHE_OPTIONS = {cf.flag for cf in CACHE_FLAGS.values()} | {"--block-size",
                                                            "--disable-radix-cache"}
COMMON = {"--max-total-tokens", "--check-invariants", "--seed", "--trace-block-size",
          "--time-scale", "--tokenizer", "--limit", "--rate", "--users", "--turns", "--skip-bad"}
TAKES = {"simulate": COMMON | CACHE_OPTIONS | SCHED_OPTIONS,
         "generate": COMMON | CACHE_OPTIONS | SCHED_OPTIONS,
         "compare": COMMON | SCHED_OPTIONS,
         "replay": COMMON | CACHE_OPTIONS}


def help_text(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as e:
        run(capsys, command, "--help")
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_every_config_field_but_internals_has_a_flag():
    assert set(SCHED_FLAGS) == {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert set(CACHE_FLAGS) == {f.name for f in dataclasses.fields(CacheConfig)} - {"enable_events"}
    assert set(ENGINE_FLAGS) == {"kv_capacity", "check_invariants"}
    assert [SCHED_FLAGS[n].flag for n in ("policy", "chunked_prefill_size", "max_running_requests",
                                          "max_prefill_tokens")] == \
        ["--schedule-policy", "--chunked-prefill-size", "--max-running-requests",
         "--max-prefill-tokens"]
    assert [CACHE_FLAGS[n].flag for n in ("kind", "page_size", "eviction")] == \
        ["--cache", "--page-size", "--radix-eviction-policy"]
    assert ENGINE_FLAGS["kv_capacity"].flag == "--max-total-tokens"


def test_simulate_help_shows_every_default(capsys):
    text = help_text(capsys, "simulate")
    for shown in ("--schedule-policy NAME queue order: fcfs, lpm, lof, random, priority, "
                  "routing-key, dfs-weight (default: fcfs)",
                  "--radix-eviction-policy NAME radix eviction order (belady: the future-aware "
                  "oracle, simulation only): lru, mru, fifo, filo, lfu, slru, priority, belady, cost, "
                  "retention, reuse (default: lru)",
                  "--max-total-tokens TOKENS|SIZE KV pool: tokens, or a byte size such as 12GiB "
                  "at the model's KV bytes per token (default: 100,000 for support, else what "
                  "the engine would allocate on the GPU)",
                  "--chunked-prefill-size N longest prefill chunk in tokens; 0 or -1: no "
                  "chunking (default: 8192)",
                  "--page-size N tokens per KV page of the radix and none caches (default: 1)",
                  "--block-size N tokens per block of the blockhash cache (default: 16)",
                  "--trace-block-size N tokens per hash id of a hash-id trace (default: 512, "
                  "Mooncake's)",
                  "--seed N seed of the workload generator, the random queue order, and "
                  "generate's weights and sampling (default: 0)",
                  "(default: support)"):
        assert shown in text


@pytest.mark.parametrize("command", sorted(TAKES))
def test_each_subcommand_takes_its_flags_and_shows_no_alias(command, capsys):
    text = help_text(capsys, command)
    options = {w.strip("[],") for w in text.split() if w.startswith(("--", "[--"))}
    assert TAKES[command] <= options
    others = set().union(*TAKES.values()) - TAKES[command]
    assert not others & options
    for old in ("--policy", "--eviction", "--kv-capacity", "--capacity", "--chunked-prefill",
                "--max-running", "--hash", "--no-dedup", "--check"):
        assert old not in options
    assert text.count("(default:") >= len(TAKES[command]) - 1      # --skip-bad is a switch


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        run(capsys, "--version")
    assert e.value.code == 0 and capsys.readouterr().out == f"radixkv {__version__}\n"


def test_defaults_are_the_dataclass_defaults_and_the_reference_run():
    for command in ("simulate", "compare"):
        args = parse(command)
        rc = configs_from_args(args, kv_bytes_per_token=1, default_tokens=REFERENCE.max_total_tokens)
        assert rc.sched == SchedulerConfig() and rc.max_total_tokens == 100_000
        assert args.workload == REFERENCE.workload == "support" and REFERENCE.rate == 4.0
        assert rc.check_invariants is False and rc.seed == 0
    rc = configs_from_args(parse("simulate"), default_tokens=REFERENCE.max_total_tokens)
    assert rc.caches == (CacheConfig(),)
    assert rc.engine(rc.caches[0]) == EngineConfig(kv_capacity=100_000)


def test_old_spellings_are_aliases_of_the_new_flags():
    new = parse("simulate", "--schedule-policy", "lpm", "--radix-eviction-policy", "lfu",
                "--max-total-tokens", "5000", "--chunked-prefill-size", "0",
                "--max-running-requests", "8", "--disable-inbatch-dedup", "--check-invariants")
    old = parse("simulate", "--policy", "lpm", "--eviction", "lfu", "--kv-capacity", "5000",
                "--chunked-prefill", "-1", "--max-running", "8", "--no-dedup", "--check")
    a, b = configs_from_args(new), configs_from_args(old)
    assert a == b
    assert a.sched == SchedulerConfig(policy="lpm", chunked_prefill_size=0, max_running_requests=8,
                                      dedup=False)
    assert a.caches == (CacheConfig("radix", 1, "lfu"),)
    assert a.max_total_tokens == 5000 and a.check_invariants
    new, old = (configs_from_args(parse("replay", "x", "--cache", "blockhash", flag, "xxhash",
                                        cap, "7"))
                for flag, cap in (("--prefix-caching-hash-algo", "--max-total-tokens"),
                                  ("--hash", "--capacity")))
    assert new == old and new.caches == (CacheConfig("blockhash", 16, hash_algo="xxhash"),)
    assert new.max_total_tokens == 7


def test_every_scheduler_field_is_set_by_its_flag():
    args = parse("simulate", "--lpm-fallback-threshold", "128", "--retract-policy", "newest",
                 "--retract-insert", "--inbatch-dedup-check-threshold", "7",
                 "--inbatch-dedup-hold-threshold", "9", "--init-new-token-ratio", "0.5",
                 "--min-new-token-ratio", "0.2", "--new-token-ratio-decay", "0.01",
                 "--enable-mixed-chunk", "--max-prefill-tokens", "4096", "--seed", "3",
                 "--slru-threshold", "4")
    rc = configs_from_args(args)
    assert rc.sched == SchedulerConfig(
        lpm_fallback_threshold=128, retract_policy="newest", retract_insert=True,
        dedup_check_threshold=7, dedup_hold_threshold=9, init_new_token_ratio=0.5,
        min_new_token_ratio=0.2, new_token_ratio_decay=0.01, mixed_decode=True,
        max_prefill_tokens=4096, seed=3)
    assert rc.caches == (CacheConfig(slru_threshold=4),) and rc.seed == 3


def test_blockhash_takes_block_size_and_radix_page_size():
    rc = configs_from_args(parse("replay", "support", "--page-size", "4", "--block-size", "32"))
    assert rc.caches == (CacheConfig("radix", 4), CacheConfig("blockhash", 32),
                         CacheConfig("none", 4))
    rc = configs_from_args(parse("simulate", "--cache", "blockhash"))
    assert rc.caches == (CacheConfig("blockhash", 16),)
    rc = configs_from_args(parse("generate", "--workload", "support", "--cache", "blockhash",
                                 "--block-size", "8"))
    assert rc.caches == (CacheConfig("blockhash", 8),)


def test_disable_radix_cache_is_cache_none():
    for argv in (("simulate", "--disable-radix-cache"), ("replay", "w", "--disable-radix-cache"),
                 ("generate", "--workload", "w", "--disable-radix-cache")):
        assert configs_from_args(parse(*argv)).caches == (CacheConfig("none"),)


def test_max_total_tokens_as_bytes_and_whole_pages():
    bpt = MODEL_SPECS["llama-3-8b"].kv_bytes_per_token_per_gpu
    rc = configs_from_args(parse("simulate", "--max-total-tokens", "12GiB", "--page-size", "16"),
                           kv_bytes_per_token=bpt)
    assert rc.max_total_tokens == 12 * 2**30 // bpt
    assert rc.engine(rc.caches[0]).kv_capacity == 12 * 2**30 // bpt // 16 * 16
    replay = parse("replay", "w")
    assert configs_from_args(replay).max_total_tokens is None            # unlimited


def test_config_spec_keys_are_the_flag_names():
    base = SchedulerConfig(max_running_requests=8)
    specs = ["a:cache=radix,page-size=16,radix-eviction-policy=lfu,schedule-policy=lpm,"
             "disable-inbatch-dedup=yes,chunked-prefill-size=-1",
             "a:cache=radix,page_size=16,eviction=lfu,policy=lpm,dedup=0,chunked_prefill_size=0",
             "a:cache=radix,page=16,eviction=lfu,policy=lpm,no-dedup=true,chunked-prefill=0"]
    want = ("a", CacheConfig("radix", 16, "lfu"),
            SchedulerConfig(policy="lpm", dedup=False, chunked_prefill_size=0,
                            max_running_requests=8))
    for spec in specs:
        assert parse_config_spec(spec, base) == want
    assert parse_config_spec("cache=blockhash,block-size=32", base)[:2] == \
        ("cache=blockhash,block-size=32", CacheConfig("blockhash", 32))


def test_simulate_and_compare_share_the_default_run(tmp_path, capsys):
    sim = tmp_path / "s.json"
    assert run(capsys, "simulate", *SMALL, "--json", sim)[0] == 0
    assert run(capsys, "compare", *SMALL, "--config", "one:cache=radix", "--out", tmp_path)[0] == 0
    a = json.loads(sim.read_text())
    b = json.loads((tmp_path / "compare.json").read_text())
    assert a["workload"] == b["workload"] and a["max_total_tokens"] == b["max_total_tokens"]
    da, db = a["results"][0]["details"], b["results"][0]["details"]
    assert {**da, "name": "one"} == db


def test_trace_block_size_replays_a_64_token_block_trace(tmp_path, capsys):
    trace, out = hash_id_trace(tmp_path / "h64.jsonl"), tmp_path / "r.json"
    rc, text, err = run(capsys, "replay", trace, "--trace-block-size", "64", "--cache", "radix",
                        "blockhash", "--json", out)
    assert (rc, err) == (0, "")
    radix, blocks = json.loads(out.read_text())["results"]
    assert (radix["prompt_tokens"], radix["hit_tokens"]) == (448, 128 + 127)
    assert (blocks["prompt_tokens"], blocks["hit_tokens"]) == (448, 128 + 112)


def test_time_scale_and_seed_reach_the_workload(tmp_path):
    trace = hash_id_trace(tmp_path / "h64.jsonl")
    w = load_from_args(parse("simulate", trace, "--trace-block-size", "64", "--time-scale", "0.5"))
    assert [r.arrival for r in w] == [0.0, 0.25, 0.5, 0.75] and w.meta["time_scale"] == 0.5
    w = load_from_args(parse("simulate", "multiturn", "--users", "2", "--turns", "2",
                             "--seed", "5", "--rate", "2"))
    assert (w.meta["seed"], w.meta["rate"], len(w)) == (5, 2.0, 4)


def test_tokenizer_reads_an_openai_chat_log(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<|", "|>", "user", "assistant", "hi", "there", "bye"]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    turn1 = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "bye"}]
    log = write_lines(tmp_path / "chat.jsonl", [
        {"messages": turn1, "timestamp": 0},
        {"messages": turn1 + [{"role": "user", "content": "bye bye"}], "timestamp": 1}])
    out = tmp_path / "r.json"
    rc, _, err = run(capsys, "replay", log, "--tokenizer", tmp_path / "tokenizer.json",
                     "--cache", "radix", "--json", out)
    assert (rc, err) == (0, "")
    (row,) = json.loads(out.read_text())["results"]
    # "<|user|>\nhi there\n<|assistant|>\n" = 3 + 2 + 3 tokens; turn 2 re-sends it and the reply
    assert row["requests"] == 2 and row["prompt_tokens"] == 8 + 17
    assert row["hit_tokens"] == 8 + 1
