"""`radixkv sweep`: the table, --json (metadata and rows), --plot, and bad input as one line."""
from __future__ import annotations

import json
import sys
import types

import pytest

from radixkv import __version__
from radixkv.sim.specs import MODEL_SPECS

from ._helpers import run

SMALL = ["support", "--users", "4", "--turns", "2", "--workers", "1"]


@pytest.fixture(autouse=True)
def one_pass_curve(monkeypatch):
    """The one-pass module, or the replayed stand-in of its contract where it is not there."""
    try:
        import radixkv.offline.planning.onepass  # noqa: F401
    except ImportError:
        from tests.offline.planning.test_sweep import replayed_curve
        fake = types.ModuleType("radixkv.offline.planning.onepass")
        fake.lru_hit_curve = replayed_curve
        monkeypatch.setitem(sys.modules, "radixkv.offline.planning.onepass", fake)


def test_json_plot_and_table(tmp_path, capsys):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    rc, text, err = run(capsys, "sweep", *SMALL, "--radix-eviction-policy", "lru", "slru",
                        "--points", "4", "--model", "llama-3-8b", "--json", out, "--plot", png)
    assert (rc, err) == (0, "")
    assert "radix p1 slru" in text and "blockhash b16" in text and "%" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = json.loads(out.read_text())
    assert {"radixkv_version", "workload", "model", "gpu", "max_total_tokens", "units",
            "results", "sweep"} <= set(d)
    assert d["radixkv_version"] == __version__ and d["model"] == "llama-3-8b"
    assert d["workload"]["name"] == "support" and d["workload"]["requests"] > 0
    rows = d["results"]
    assert {r["line"] for r in rows} == {"radix p1 lru", "radix p1 slru", "blockhash b16"}
    assert d["max_total_tokens"] == max(r["capacity_tokens"] for r in rows)
    bpt = MODEL_SPECS["llama-3-8b"].kv_bytes_per_token_per_gpu
    for r in rows:
        assert list(r) == ["line", "cache", "page_size", "eviction", "capacity_tokens",
                           "capacity_bytes", "hit_rate", "hit_tokens", "method"]
        assert r["capacity_bytes"] == r["capacity_tokens"] * bpt
        assert 0 <= r["hit_rate"] <= 1
        assert r["method"] == ("one-pass" if r["eviction"] == "lru" else "replay")
    assert d["units"]["capacity_tokens"] == "tokens" and d["units"]["capacity_bytes"] == "bytes"
    assert d["units"]["hit_rate"] == "fraction"
    s = d["sweep"]
    assert s["evict_granularity"] == "page" and s["kv_bytes_per_token"] == bpt
    assert set(s["capacity_tokens_for_share_of_ceiling"]["radix p1 lru"]) == {"0.5", "0.8", "0.9"}


def test_explicit_capacities_and_infeasible_rows(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc, text, err = run(capsys, "sweep", *SMALL, "--cache", "radix", "--capacities", "16",
                        "1GiB", "--model", "llama-3-8b", "--json", out)
    assert (rc, err) == (0, "")
    rows = json.loads(out.read_text())["results"]
    bpt = MODEL_SPECS["llama-3-8b"].kv_bytes_per_token_per_gpu
    assert [r["capacity_tokens"] for r in rows] == [16, 2**30 // bpt]
    assert rows[0]["hit_rate"] is None and rows[1]["hit_rate"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--points", "0"], "--points must be at least 1"),
    (["--capacities", "12 parsecs"], "--capacities: bad capacity"),
    (["--capacities", "8GiB"], "give --model"),
    (["--capacities", "0"], "less than one token"),
    (["--cache", "blockhash", "--page-size", "4"], "--page-size"),
    (["--radix-eviction-policy", "nope"], "nope"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "s.json"
    rc, text, err = run(capsys, "sweep", *SMALL, *argv, "--json", out)
    assert rc == 2 and message in err and err.count("\n") == 1
    assert err.startswith("radixkv sweep: error: ")
    assert not out.exists()


def test_outputs_checked_before_the_run(tmp_path, capsys):
    rc, text, err = run(capsys, "sweep", *SMALL, "--plot", tmp_path / "no" / "s.png")
    assert rc == 2 and "does not exist" in err and text == ""
