"""`radixkv cluster`: one row per router, the JSON and the plot written, bad flags refused in
one line before any run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli import main

TRACE = Path(__file__).resolve().parents[2].parent / "shared/traces/mooncake/synthetic_trace.jsonl"
SMALL = ["support", "--users", "8", "--turns", "2", "--replicas", "2", "--workers", "1"]


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_rows_json_and_plot(tmp_path, capsys):
    out_json, png = tmp_path / "c.json", tmp_path / "cluster.png"
    rc, out, err = run(capsys, "cluster", *SMALL, "--router", "round-robin", "radixkv",
                       "session-hash", "--json", out_json, "--plot", png)
    assert (rc, err) == (0, "")
    doc = json.loads(out_json.read_text())
    assert [r["router"] for r in doc["results"]] == ["round-robin", "radixkv", "session-hash"]
    # the pool the engine would allocate on the GPU, priced by its measured tables
    assert doc["replicas"] == 2 and doc["max_total_tokens"] == 432_992
    assert doc["timing"] == "measured: aiconfigurator-core 0.12.0 vllm 0.24.0 tables"
    assert doc["units"]["ttft_p99"] == "s" and doc["units"]["hit_rate"] == "fraction"
    for row in doc["results"]:
        assert set(row) >= {"hit_rate", "prefill_tokens", "ttft_p50", "ttft_p99", "e2e_p99",
                            "throughput_tok_s", "imbalance", "evicted_tokens"}
        assert row["router"] in out
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("argv, line", [
    (["--router", "nope"], "unknown router 'nope'; valid: "),
    (["--router", "radixkv", "radixkv"], "--router names a router twice: radixkv radixkv"),
    (["--replicas", "0"], "--replicas must be a positive int, got 0"),
    (["--max-total-tokens", "100"], "request "),
    (["--json", "/nonexistent/x.json"], "--json '/nonexistent/x.json': the folder"),
])
def test_bad_flags_are_one_line(capsys, argv, line):
    rc, out, err = run(capsys, "cluster", *SMALL, *argv)
    assert rc == 2 and err.startswith(f"radixkv cluster: error: {line}") and err.count("\n") == 1


@pytest.mark.skipif(not TRACE.is_file(), reason="the Mooncake trace is not in ../shared/traces")
def test_mooncake_trace_head(capsys, tmp_path):
    rc, out, err = run(capsys, "cluster", TRACE, "--limit", "60", "--replicas", "2",
                       "--workers", "1", "--router", "round-robin", "radixkv",
                       "--json", tmp_path / "m.json")
    assert rc == 0, err
    rows = json.loads((tmp_path / "m.json").read_text())["results"]
    assert rows[1]["hit_rate"] >= rows[0]["hit_rate"]
