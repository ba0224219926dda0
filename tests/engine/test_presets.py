"""Engine presets (`--engine`): each engine's shipped defaults, sized to the GPU and pool as
the engine sizes them; flags given win; vLLM's one token budget in the scheduler."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.engine.presets import ENGINES, engine_defaults
from tests.sched._helpers import make_engine, toks
from radixkv.sched.request import Request

GB = 10**9
GiB = 1 << 30


@pytest.mark.parametrize("gpu_bytes, name, tokens, seqs", [
    (80 * GiB, "h100-sxm", 8192, 1024),     # >= 70 GiB, not an A100
    (141 * GB, "h200", 8192, 1024),         # 131 GiB: still below the 160 GiB row
    (80 * GiB, "a100-80g", 2048, 256),      # A100s keep the small row (vLLM PR #17885)
    (48 * GB, "l40s", 2048, 256),
    (180 * GiB, "b200", 16384, 1024),
])
def test_vllm_rows_by_gpu(gpu_bytes, name, tokens, seqs):
    e = engine_defaults("vllm", gpu_bytes, name, 432_992)
    assert (e.cache, e.page_size, e.timing) == ("blockhash", 16, "vllm")
    assert e.sched == dict(policy="fcfs", max_prefill_tokens=tokens, chunked_prefill_size=tokens,
                           max_running_requests=seqs, mixed_decode=True,
                           shared_token_budget=True, dedup=False, queue_aware_eviction=False)


@pytest.mark.parametrize("gpu_bytes, kv, chunk, running", [
    (80 * GiB, 382_703, 8192, 2048),        # 382,703 / 131,072 * 512 = 1,494 -> floor 2,048
    (141 * GB, 1_000_000, 8192, 3906),      # 1e6 / 131,072 * 512 = 3,906
    (192 * GB, 3_000_000, 16384, 4096),     # capped at 4,096
    (80 * GiB, 3_000, 8192, 1500),          # never more than half the tokens
    (48 * GB, 100_000, 4096, 2048),
    (24 * GB, 50_000, 2048, 2048),
])
def test_sglang_chunk_by_memory_and_cap_by_pool(gpu_bytes, kv, chunk, running):
    e = engine_defaults("sglang", gpu_bytes, "x", kv)
    assert (e.cache, e.page_size, e.timing) == ("radix", 1, "sglang")
    assert e.sched["chunked_prefill_size"] == chunk
    assert e.sched["max_running_requests"] == running
    assert (e.sched["max_prefill_tokens"], e.sched["mixed_decode"], e.sched["policy"]) == \
        (16384, False, "fcfs")


def test_every_preset_builds_a_valid_scheduler_config():
    for name in ENGINES:
        SchedulerConfig(**engine_defaults(name, 80 * GiB, "h100-sxm", 400_000).sched)
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        engine_defaults("tgi", 80 * GiB, "h100-sxm", 1)


def _first_mixed_step(shared: bool) -> tuple[int, int]:
    """(decodes, prefill tokens) of the first step that mixes both: 3 requests decoding, then
    a long prompt arrives; budget 64."""
    sched = SchedulerConfig(max_prefill_tokens=64, chunked_prefill_size=64, mixed_decode=True,
                            shared_token_budget=shared)
    eng = make_engine(10_000, CacheConfig("radix"), sched, check=True)
    for i in range(3):
        eng.add_request(Request(f"d{i}", toks(1000 * i, 8), max_new_tokens=50))
    eng.step()
    eng.add_request(Request("long", toks(50_000, 300), max_new_tokens=1))
    for _ in range(3):
        eng.step()
        for step in eng.executor.steps:
            kinds = [seg[4] for seg in step]
            if "extend" in kinds and "decode" in kinds:
                return kinds.count("decode"), sum(s[2] for s in step if s[4] == "extend")
    raise AssertionError("no mixed step")


def test_shared_token_budget_takes_the_decodes_out_of_the_prefill():
    assert _first_mixed_step(shared=False) == (3, 64)
    assert _first_mixed_step(shared=True) == (3, 61)


def _simulate(tmp_path, capsys, *flags) -> dict:
    out = tmp_path / "run.json"
    assert main(["simulate", "multiturn", "--users", "4", "--turns", "2", *flags,
                 "--json", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


def test_cli_engine_sets_cache_pool_and_timing(tmp_path, capsys):
    d = _simulate(tmp_path, capsys, "--engine", "vllm")
    assert d["timing"] == "measured: aiconfigurator-core 0.12.0 vllm 0.24.0 tables"
    assert d["max_total_tokens"] == 432_992
    assert d["results"][0]["name"].startswith("blockhash b16")
    d = _simulate(tmp_path, capsys, "--engine", "sglang", "--page-size", "16")
    assert d["timing"] == "measured: aiconfigurator-core 0.12.0 sglang 0.5.14 tables"
    assert d["max_total_tokens"] == 382_688           # 382,703 in whole pages of 16
    assert d["results"][0]["name"].startswith("radix")
    d = _simulate(tmp_path, capsys, "--engine", "sglang", "--timing", "roofline")
    assert d["timing"] == "roofline: 400 TFLOP/s assumed"


def test_cli_engine_with_a_profile_is_refused(tmp_path, capsys):
    prof = tmp_path / "p.json"
    prof.write_text("{}")
    assert main(["simulate", "multiturn", "--engine", "vllm", "--profile", str(prof)]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm does not apply with --profile" in err
