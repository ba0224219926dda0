"""Outputs a user can keep: compare.json, simulate/replay/generate --json with the same metadata
and units, strict JSON, the files compare writes, and rates shown as percents."""
from __future__ import annotations

import json
import re

import pytest
import torch

from radixkv import __version__
from radixkv.commands.output import JSON_KEYS, UNITS, Outputs, units_of, unit_of

from ._helpers import SMALL, hash_id_trace, run

TOP = ["radixkv_version", "workload", "model", "gpu", "timing", "max_total_tokens", "max_concurrency",
       "units", "results"]


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def strict(path) -> dict:
    """The file as JSON, refusing NaN and infinities as a strict reader would."""
    def refuse(name):
        raise AssertionError(f"{path} holds {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


def numeric_keys(rows) -> set[str]:
    return {k for row in rows for part in (row, row.get("details") or {}) for k, v in part.items()
            if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}


def test_compare_json_png_and_timeline(tmp_path, capsys):
    out = tmp_path / "o"
    rc, text, err = run(capsys, "compare", *SMALL, "--out", out)
    assert (rc, err) == (0, "")
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.png", "timeline.png"]
    for png in ("compare.png", "timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = strict(out / "compare.json")
    assert list(d) == TOP
    assert d["radixkv_version"] == __version__
    assert d["workload"] == {"name": "support", "source": "generator:support", "requests": 40,
                             "prompt_tokens": d["results"][0]["details"]["prompt_tokens"]}
    assert (d["model"], d["gpu"], d["max_total_tokens"]) == ("llama-3-8b", "h100-sxm", 100_000)
    assert [r["name"] for r in d["results"]] == [
        "1 radix fcfs lru p1", "2 radix lpm slru p1", "3 radix fcfs lru p16", "4 no cache",
        "5 blockhash16 fcfs", "6 radix fcfs belady p1"]
    for row in d["results"]:
        assert list(row) == [*JSON_KEYS, "details"]
        assert all(row[k] == row["details"][k] for k in JSON_KEYS)
    assert set(d["units"]) == numeric_keys(d["results"]) and set(d["units"].values()) <= set(UNITS)
    assert {k: d["units"][k] for k in ("hit_rate", "prefill_tokens", "ttft_p50",
                                       "throughput_tok_s", "retractions", "peak_kv_usage")} == \
        {"hit_rate": "fraction", "prefill_tokens": "tokens", "ttft_p50": "s",
         "throughput_tok_s": "tokens/s", "retractions": "count", "peak_kv_usage": "fraction"}
    hit = d["results"][0]["hit_rate"]
    assert f"{100 * hit:.1f}%" in text


def test_simulate_json_has_compare_metadata(tmp_path, capsys):
    path = tmp_path / "s.json"
    rc, text, _ = run(capsys, "simulate", *SMALL, "--max-total-tokens", "12GiB", "--json", path)
    assert rc == 0 and f"wrote {path}" in text
    d = strict(path)
    assert list(d) == TOP and d["max_total_tokens"] == 98_304
    (row,) = d["results"]
    assert list(row) == [*JSON_KEYS, "details"] and row["name"] == "radix p1 lru/fcfs"
    assert set(d["units"]) == numeric_keys(d["results"])
    assert re.search(r"hit_rate\s+│\s+\d+\.\d%", text) and f"{100 * row['hit_rate']:.1f}%" in text


def test_replay_json_has_the_metadata(tmp_path, capsys):
    trace, path = hash_id_trace(tmp_path / "h64.jsonl"), tmp_path / "r.json"
    assert run(capsys, "replay", trace, "--trace-block-size", "64", "--model", "llama-3-8b",
               "--max-total-tokens", "64MiB", "--json", path)[0] == 0
    d = strict(path)
    assert list(d) == TOP
    assert d["workload"] == {"name": "h64", "source": str(trace), "requests": 4,
                             "prompt_tokens": 448}
    assert (d["model"], d["gpu"], d["max_total_tokens"]) == ("llama-3-8b", None, 512)
    assert [r["cache"] for r in d["results"]] == ["radix", "blockhash", "none"]
    assert d["units"] == {
        "requests": "count", "prompt_tokens": "tokens", "hit_tokens": "tokens",
        "hit_rate": "fraction", "evicted_tokens": "tokens", "orphan_blocks": "count",
        "peak_nodes": "count", "duplicate_blocks": "count", "cpu_us_per_request": "us",
        "wall_s": "s", "capacity": "tokens"}


def test_replay_pool_too_small_for_a_request(tmp_path, capsys):
    # 1 MiB of Llama-3-8B KV is 8 tokens: smaller than any request of the trace
    trace = hash_id_trace(tmp_path / "h64.jsonl")
    rc, _, err = run(capsys, "replay", trace, "--trace-block-size", "64", "--model",
                     "llama-3-8b", "--max-total-tokens", "1MiB", "--cache", "radix")
    assert rc == 2 and "capacity 8 tokens is smaller than one request" in err


def test_generate_json_matches_simulate(tmp_path, capsys):
    gen, sim = tmp_path / "g.json", tmp_path / "s.json"
    assert run(capsys, "generate", "--device", "cpu", "--workload", "support", "--users", "2",
               "--turns", "2", "--json", gen)[0] == 0
    assert run(capsys, "simulate", *SMALL, "--json", sim)[0] == 0
    g, s = strict(gen), strict(sim)
    assert list(g) == list(s) == TOP and g["units"] == s["units"]
    assert list(g["results"][0]) == list(s["results"][0])
    assert list(g["results"][0]["details"]) == list(s["results"][0]["details"])
    assert (g["model"], g["gpu"], g["max_total_tokens"]) == ("tiny-llama", "cpu", 65536)
    assert g["workload"]["source"] == "generator:support" and g["workload"]["requests"] == 5


def test_generate_model_dir_brings_its_tokenizer(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from radixkv.model.model import Transformer
    from radixkv.model.weights import save_hf_checkpoint
    from radixkv.shapes import ModelArgs

    args = ModelArgs("w", vocab_size=8, dim=32, n_layers=1, n_heads=4, n_kv_heads=2,
                     intermediate_size=48)
    save_hf_checkpoint(Transformer(args).init_random(0), args, tmp_path / "ck")
    words = ["[UNK]", "hello", "world", "again", "!", "x", "y", "z"]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "ck" / "tokenizer.json"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world !\nhello world again !\n")
    path = tmp_path / "g.json"
    rc, text, err = run(capsys, "generate", "--device", "cpu", "--model", tmp_path / "ck",
                        "--prompts", prompts, "--max-new-tokens", "2",
                        "--max-running-requests", "1", "--json", path)
    assert (rc, err) == (0, "")
    d = strict(path)
    assert d["workload"] == {"name": "p", "source": str(prompts), "requests": 2,
                             "prompt_tokens": 3 + 4}               # words, not bytes
    assert d["results"][0]["details"]["cached_tokens"] == 2       # "hello world"


def test_outputs_appear_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "new" / "a.json", tmp_path / "new" / "b.txt"
    with pytest.raises(RuntimeError):
        with Outputs() as out:
            out.write_json(a, {"x": 1})
            out.path(b).write_text("b")
            raise RuntimeError
    assert not (tmp_path / "new").exists()
    with Outputs() as out:
        out.write_json(a, {"x": 1})
        out.path(b).write_text("b")
        assert not a.exists() and not b.exists()
    assert sorted(p.name for p in a.parent.iterdir()) == ["a.json", "b.txt"]
    assert json.loads(a.read_text()) == {"x": 1} and b.read_text() == "b"


def test_strict_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError, match="a result is not a finite number"):
        with Outputs() as out:
            out.write_json(tmp_path / "n.json", {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key, unit", [
    ("ttft_p99", "s"), ("e2e_p50", "s"), ("tpot_mean", "s"), ("makespan_s", "s"),
    ("throughput_tok_s", "tokens/s"), ("total_tok_s", "tokens/s"), ("cached_tokens", "tokens"),
    ("capacity", "tokens"), ("hit_rate", "fraction"), ("peak_kv_usage", "fraction"),
    ("steps", "count"), ("peak_queue", "count"), ("cpu_us_per_request", "us")])
def test_units(key, unit):
    assert unit_of(key) == unit
    assert units_of([{"name": "a", key: None, "flag": True}]) == {key: unit}
