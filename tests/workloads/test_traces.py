"""Hash-id (Mooncake) traces: expansion, validation, the block reuse bound, the real trace."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from radixkv.workloads import (TraceFormatError, block_reuse_ratio, load_workload,
                               read_hash_id_trace, read_mooncake, write_jsonl, read_jsonl)

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MOONCAKE = TRACES / "mooncake" / "synthetic_trace.jsonl"


def line(ts, n_in, n_out, ids):
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                       "hash_ids": ids})


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def tiny(tmp_path):
    # Request 2 extends request 1's first two blocks; request 3 repeats request 1 exactly.
    return write(tmp_path / "tiny.jsonl", [
        line(0, 1200, 5, [10, 11, 12]),        # 512 + 512 + 176
        line(1500, 1100, 0, [10, 11, 20]),     # 512 + 512 + 76
        line(2500, 1200, 3, [10, 11, 12]),
    ])


def test_expansion(tiny):
    w = read_mooncake(tiny, vocab_size=1000)
    a, b, c = w.requests
    assert [len(r.prompt) for r in w] == [1200, 1100, 1200] and w.block_size == 512
    assert [r.arrival for r in w] == [0.0, 1.5, 2.5] and a.id == "tiny-1"
    assert a.prompt[:1024] == b.prompt[:1024]          # equal ids, equal runs
    assert a.prompt[1024:1100] != b.prompt[1024:]       # different ids differ
    assert a.prompt[:512] != a.prompt[512:1024]
    assert a.prompt == c.prompt
    assert all(type(t) is int and 0 <= t < 1000 for t in a.prompt)
    # Outputs are explicit and unique per request, so replay adds no fake sharing.
    assert a.output_len == 5 and len(a.output) == 5 and b.output == () and a.output != c.output
    assert read_mooncake(tiny, vocab_size=1000) == w
    # The run of an id does not depend on the file: the same id elsewhere, same tokens.
    other = read_hash_id_trace(write(tiny.with_name("o.jsonl"), [line(0, 10, 1, [11])]),
                               vocab_size=1000)
    assert other[0].prompt == a.prompt[512:522]


def test_partial_last_block_and_block_size(tmp_path):
    p = write(tmp_path / "bs.jsonl", [line(0, 33, 1, [1, 2, 3]), line(5, 32, 1, [1, 2])])
    w = read_hash_id_trace(p, block_size=16, vocab_size=256)
    assert [len(r.prompt) for r in w] == [33, 32] and w[0].prompt[:32] == w[1].prompt


@pytest.mark.parametrize("bad, what", [
    ("{oops", "Expecting"),
    ('"text"', "expected a JSON object"),
    (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}), "hash_ids"),
    (line(0, 600, 1, [1]), "len(hash_ids) = 1"),
    (line(0, 600, -1, [1, 2]), "output_length"),
    (line(0, 0, 1, []), "input_length"),
    (line(-3, 5, 1, [1]), "timestamp"),
    (line(0, 5, 1, ["a"]), "hash_ids must hold ints"),
    (line(0, 5, 1, [-1]), "hash_ids must hold ints"),
    (line(0, 5, True, [1]), "output_length"),
])
def test_malformed_lines(tmp_path, bad, what):
    p = write(tmp_path / "bad.jsonl", [line(0, 5, 1, [1]), bad, line(9, 5, 1, [2])])
    with pytest.raises(TraceFormatError) as e:
        read_mooncake(p)
    assert f"{p}:2:" in str(e.value) and what in str(e.value)
    w = read_mooncake(p, skip_bad=True)
    assert w.skipped == 1 and [r.id for r in w] == ["bad-1", "bad-3"]


def test_limit_and_load_workload_detection(tiny, tmp_path):
    assert len(read_mooncake(tiny, limit=2)) == 2
    w = load_workload(str(tiny), block_size=512, vocab_size=500)
    assert len(w) == 3 and w.meta["format"] == "hash_ids"
    # A converted trace reads back as a TraceRequest JSONL file.
    p = tmp_path / "conv.jsonl"
    write_jsonl(w, p)
    assert load_workload(p) == read_jsonl(p) == w


def test_block_reuse_ratio_tiny(tiny):
    # Blocks: r1 all new; r2 reuses 2 full blocks (1024 of 1100); r3 reuses all 1200.
    tokens = (1024 + 1200) / (1200 + 1100 + 1200)
    assert block_reuse_ratio(tiny) == pytest.approx(tokens)
    assert block_reuse_ratio(tiny, by="blocks") == pytest.approx(5 / 9)
    w = read_mooncake(tiny)
    assert block_reuse_ratio(w) == pytest.approx(tokens)
    assert block_reuse_ratio(w, by="blocks") == pytest.approx(5 / 9)
    with pytest.raises(ValueError, match="by must be"):
        block_reuse_ratio(w, by="bytes")  # type: ignore[arg-type]


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"{MOONCAKE} not present")
def test_real_mooncake_trace():
    t = time.perf_counter()
    w = read_mooncake(MOONCAKE)
    load_s = time.perf_counter() - t
    assert len(w) == 3993 and w.skipped == 0 and load_s < 20
    assert w.num_prompt_tokens == 61_194_628
    assert max(len(r.prompt) for r in w) == 191_378
    # Paper: 66% cache ratio; block-level upper bound from the hash ids of this file:
    by_tokens = block_reuse_ratio(MOONCAKE)
    by_blocks = block_reuse_ratio(MOONCAKE, by="blocks")
    assert abs(by_tokens - 0.651) < 0.002 and abs(by_blocks - 0.640) < 0.002
    assert abs(by_tokens - 0.64) < 0.02 and abs(by_blocks - 0.64) < 0.02
