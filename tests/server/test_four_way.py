"""radixkv four-way: the metrics parsing and row arithmetic, the server subprocess's start,
failure and stop, and a whole run on the sim executor."""
from __future__ import annotations

import json

import pytest

from radixkv.bench import four_way
from radixkv.bench.client import BenchResult
from radixkv.bench.process import ServerProcess
from radixkv.promtext import parse_metrics
from radixkv.cli import main

METRICS = """\
# HELP vllm:prefix_cache_queries Prefix-cache queries, tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m",tenant="a"} 100.0
vllm:prefix_cache_queries_total{model_name="m",tenant="b"} 50.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 90.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 4.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 2.5
"""


def test_parse_metrics_sums_label_sets_and_skips_histograms():
    m = parse_metrics(METRICS)
    assert m == {"vllm:prefix_cache_queries_total": 150.0,
                 "vllm:prefix_cache_hits_total": 90.0, "vllm:num_requests_running": 2.0}


def test_row_arithmetic():
    summary = {"requests": 4, "completed": 4, "errors": 0, "prompt_tokens": 150,
               "cached_tokens": 80, "ttft_p50": 0.1, "ttft_p99": 0.2, "e2e_p99": 1.0,
               "output_tok_s": 10.0}
    before = {four_way.QUERIES: 10.0, four_way.HITS: 0.0}
    after = {four_way.QUERIES: 160.0, four_way.HITS: 90.0, four_way.EVICTED: 7.0}
    row = four_way.make_row("page16", BenchResult("m", [], summary), before, after)
    assert (row["queried_tokens"], row["hit_tokens"], row["prefill_tokens"]) == (150, 90, 60)
    assert row["hit_rate"] == 0.6 and row["evicted_tokens"] == 7 and row["retractions"] is None
    assert row["flags"] == "--page-size 16" and row["cached_tokens"] == 80
    empty = four_way.make_row("no-cache", BenchResult("m", [], summary), {}, {})
    assert empty["hit_rate"] is None and empty["prefill_tokens"] is None


def test_fewshot_sizes_follow_the_vocabulary():
    small = four_way.make_fewshot_workload("fewshot", "tiny-llama", None, float("inf"), 0)
    assert len(small) == 64 and max(max(r.prompt) for r in small) < 256
    assert all(r.arrival == 0 for r in small)
    big = four_way.make_fewshot_workload("fewshot", "llama-3-8b", 3, 2.0, 0)
    assert len(big) == 3 and len(big[0].prompt) > 4000 and big[-1].arrival > 0


def test_server_that_fails_to_start_names_its_error():
    with pytest.raises(ChildProcessError, match="unknown simulated model 'nope'"):
        with ServerProcess(["--executor", "sim", "--model", "nope"], startup_timeout=60):
            pass


def test_server_is_stopped_when_the_block_is_interrupted():
    with pytest.raises(KeyboardInterrupt):
        with ServerProcess(["--executor", "sim", "--model", "llama-3-8b"],
                           startup_timeout=60) as srv:
            proc = srv.proc
            assert srv.base_url.startswith("http://127.0.0.1:")
            raise KeyboardInterrupt
    assert proc.poll() is not None


def test_four_way_on_sim(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(four_way.FEWSHOT, "large", dict(
        num_questions=6, preamble_len=256, question_len=(8, 16), output_len=(2, 4),
        vocab_size=256))
    out = tmp_path / "fw"
    rc = main(["four-way", "--executor", "sim", "--model", "llama-3-8b", "--out-dir", str(out),
               "--startup-timeout", "60"])
    text = capsys.readouterr().out
    assert rc == 0, text
    doc = json.loads((out / "four_way.json").read_text())
    rows = {r["name"]: r for r in doc["results"]}
    assert list(rows) == ["default", "lpm-slru", "page16", "no-cache"]
    assert all(r["requests"] == 6 and r["completed"] == 6 and r["errors"] == 0
               for r in rows.values())
    assert rows["no-cache"]["hit_tokens"] == 0 and rows["no-cache"]["cached_tokens"] == 0
    assert rows["default"]["hit_tokens"] > 0 and rows["default"]["hit_rate"] > 0.5
    assert rows["no-cache"]["prefill_tokens"] == rows["no-cache"]["prompt_tokens"]
    assert (out / "four_way.png").stat().st_size > 0 and "no-cache" in text
    assert doc["executor"] == "sim" and doc["request_rate"] == "inf"


def test_four_way_refuses_bad_input(tmp_path, capsys):
    rc = main(["four-way", "--executor", "torch", "--gpu", "h100-sxm", "--out-dir",
               str(tmp_path)])
    assert rc == 2 and "--gpu h100-sxm applies to --executor sim" in capsys.readouterr().err
    (tmp_path / "f").write_text("")
    rc = main(["four-way", "--out-dir", str(tmp_path / "f")])
    assert rc == 2 and "is a file, not a folder" in capsys.readouterr().err
