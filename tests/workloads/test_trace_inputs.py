"""Trace inputs: other hash-id block sizes, bad bytes and absurd sizes in every reader and
generator, empty files, the time scale, and the `source` every workload names."""
from __future__ import annotations

import contextlib
import json
import tracemalloc

import pytest

from radixkv.workloads import (MAX_REQUEST_TOKENS, TraceFormatError, TraceRequest, Workload,
                               burst, fewshot, load_workload, make_workload, multiturn, rag,
                               read_hash_id_trace, read_jsonl, support, trace_format, tree,
                               write_jsonl)


@contextlib.contextmanager
def peak_mib():
    """Peak Python memory (MiB) allocated inside the block, in a one-item list: a bound on
    work done that, unlike wall time, does not depend on the machine's load."""
    out = [0.0]
    tracemalloc.start()
    try:
        yield out
    finally:
        out[0] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()


def hash_line(ts, n_in, n_out, ids):
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                       "hash_ids": ids})


def rec(id="a", prompt=(1, 2), output=None, output_len=3, **kw):
    d = {"id": id, "arrival": 0, "prompt": list(prompt), "output_len": output_len, **kw}
    if output is not None:
        d["output"] = list(output)
        del d["output_len"]
    return json.dumps(d)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


# ---- hash-id traces with 64-token blocks -----------------------------------------------------

@pytest.fixture
def blocks64(tmp_path):
    return write(tmp_path / "b64.jsonl", [
        hash_line(0, 150, 4, [1, 2, 3]),         # 64 + 64 + 22
        hash_line(250, 128, 0, [1, 2]),          # two full blocks shared with line 1
        hash_line(500, 64, 2, [1]),
        hash_line(750, 200, 1, [1, 2, 7, 8]),    # 64 * 3 + 8
    ])


def test_load_workload_with_64_token_blocks(blocks64):
    assert trace_format(blocks64) == "hash_ids"
    w = load_workload(blocks64, block_size=64, vocab_size=1000)
    a, b, c, d = w
    assert [r.prompt_len for r in w] == [150, 128, 64, 200]
    assert w.block_size == 64 and w.meta["block_size"] == 64 and w.meta["source"] == str(blocks64)
    assert [r.arrival for r in w] == [0.0, 0.25, 0.5, 0.75]
    assert b.prompt == a.prompt[:128] == d.prompt[:128] and c.prompt == a.prompt[:64]
    assert a.prompt[:64] != a.prompt[64:128] and d.prompt[128:150] != a.prompt[128:]
    assert [r.output_len for r in w] == [4, 0, 2, 1]
    assert w == read_hash_id_trace(blocks64, block_size=64, vocab_size=1000)
    # A partial last block is the prefix of that id's full block.
    full = read_hash_id_trace(write(blocks64.with_name("f.jsonl"), [hash_line(0, 64, 0, [3])]),
                              block_size=64, vocab_size=1000)
    assert full[0].prompt[:22] == a.prompt[128:]


def test_input_length_is_checked_against_the_block_size(blocks64, tmp_path):
    # At Mooncake's 512-token blocks, 150 tokens need one id, not three.
    with pytest.raises(TraceFormatError, match=rf"{blocks64}:1: len\(hash_ids\) = 3 but "
                                               r"input_length 150 needs ceil\(150/512\) = 1"):
        load_workload(blocks64)
    bad = write(tmp_path / "bad.jsonl", [hash_line(0, 150, 1, [1, 2, 3]),
                                         hash_line(1, 150, 1, [1, 2])])
    with pytest.raises(TraceFormatError, match=r":2: len\(hash_ids\) = 2 .* ceil\(150/64\) = 3"):
        load_workload(bad, block_size=64)
    assert load_workload(bad, block_size=64, skip_bad=True).skipped == 1


@pytest.mark.parametrize("block_size", [0, -64, 64.0, True, 2**24 + 1])
def test_bad_block_sizes(blocks64, block_size):
    with pytest.raises(ValueError, match="block_size"):
        load_workload(blocks64, block_size=block_size)


def test_block_size_applies_to_hash_id_traces_only(tmp_path):
    p = write(tmp_path / "req.jsonl", [rec()])
    with pytest.raises(ValueError) as e:
        load_workload(p, block_size=64)
    assert str(p) in str(e.value)
    assert "block_size applies to hash-id traces only" in str(e.value)
    assert "radixkv JSONL trace" in str(e.value)
    with pytest.raises(ValueError, match="block_size applies to hash-id traces only, not to "
                                         "the generator 'burst'"):
        load_workload("burst", block_size=64)
    assert len(load_workload(p, block_size=None)) == 1
    assert len(load_workload("burst", block_size=None, num_requests=2)) == 2


def test_a_large_block_size_expands_only_what_the_trace_holds(tmp_path):
    p = write(tmp_path / "big.jsonl", [hash_line(0, 3, 0, [i]) for i in range(2000)]
              + [hash_line(1, MAX_REQUEST_TOKENS, 0, [9])])
    with peak_mib() as peak:
        w = read_hash_id_trace(p, block_size=MAX_REQUEST_TOKENS, vocab_size=100)
    assert len(w) == 2001 and w.num_prompt_tokens == 3 * 2000 + MAX_REQUEST_TOKENS
    # what the trace holds, not 2001 requests of block_size tokens each (GiBs)
    assert peak[0] < 40 * (1 + MAX_REQUEST_TOKENS // 2**20)


# ---- token ids out of range ----------------------------------------------------------------

@pytest.mark.parametrize("bad, what", [
    (rec("b", prompt=(1, 2**32)), "prompt holds token id 4294967296, outside [0, 2**32)"),
    (rec("b", prompt=(2**40,)), "prompt holds token id 1099511627776"),
    (rec("b", prompt=(1, -1)), "prompt holds a negative token id -1"),
    (rec("b", output=(5, 2**32)), "output holds token id 4294967296"),
    (rec("b", output=(-7,)), "output holds a negative token id -7"),
])
def test_token_ids_outside_32_bits_are_line_errors(tmp_path, bad, what):
    p = write(tmp_path / "ids.jsonl", [rec("a"), bad, rec("c", prompt=(2**32 - 1,))])
    with pytest.raises(TraceFormatError) as e:
        read_jsonl(p)
    assert str(e.value).startswith(f"{p}:2: ") and what in str(e.value)
    w = load_workload(p, skip_bad=True)
    assert w.skipped == 1 and [r.id for r in w] == ["a", "c"]
    assert w[1].prompt == (2**32 - 1,)


# ---- files that are not UTF-8 --------------------------------------------------------------

def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(rec("a").encode() + b"\n"
                  + rec("b", extra_key="cafe").replace("cafe", "caf\xe9").encode("latin-1")
                  + b"\n"
                  + rec("c").encode() + b"\n")
    with pytest.raises(TraceFormatError) as e:
        load_workload(p)
    assert str(e.value).startswith(f"{p}:2: not UTF-8 text: byte 0xe9 at column")
    w = load_workload(p, skip_bad=True)
    assert w.skipped == 1 and [r.id for r in w] == ["a", "c"]


def test_non_utf8_hash_id_trace_and_first_line(tmp_path):
    p = tmp_path / "h.jsonl"
    p.write_bytes(b"\xff\xfe garbage\n" + hash_line(0, 5, 1, [1]).encode() + b"\n")
    assert trace_format(p) == "hash_ids"       # the kind comes from the first readable record
    with pytest.raises(TraceFormatError, match=rf"{p}:1: not UTF-8 text: byte 0xff at column "
                                               r"1 \(the file looks like UTF-16"):
        load_workload(p)
    w = load_workload(p, skip_bad=True)
    assert w.skipped == 1 and len(w) == 1


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + rec("a").encode() + b"\n")
    assert [r.id for r in load_workload(p)] == ["a"]


# ---- absurd sizes --------------------------------------------------------------------------

@pytest.mark.parametrize("bad, what", [
    (rec("b", output_len=10**12), "output_len 1,000,000,000,000 is over the bound of "
                                  "16,777,216 (2**24) tokens per request"),
    (rec("b", output_len=1e12), "output_len must be an int"),
    (rec("b", output_len=2**24), "prompt + output length 16,777,218 is over the bound"),
])
def test_absurd_sizes_in_jsonl(tmp_path, bad, what):
    p = write(tmp_path / "s.jsonl", [rec("a"), bad])
    with pytest.raises(TraceFormatError) as e:
        read_jsonl(p)
    assert f"{p}:2: " in str(e.value) and what in str(e.value)
    assert read_jsonl(p, skip_bad=True).skipped == 1


@pytest.mark.parametrize("bad, what", [
    (hash_line(0, 5, 10**12, [1]), "output_length 1,000,000,000,000 is over the bound"),
    (hash_line(0, 5, 1e12, [1]), "output_length must be an int"),
    (hash_line(0, 2**24 + 1, 0, [1]), "input_length 16,777,217 is over the bound"),
    (hash_line(0, 2**24, 1, [1] * 2**15), "input_length + output_length 16,777,217"),
])
def test_absurd_sizes_in_hash_id_traces(tmp_path, bad, what):
    p = write(tmp_path / "h.jsonl", [hash_line(0, 5, 1, [1]), bad])
    with peak_mib() as peak, pytest.raises(TraceFormatError) as e:
        read_hash_id_trace(p)
    assert f"{p}:2: " in str(e.value) and what in str(e.value)
    assert read_hash_id_trace(p, skip_bad=True).skipped == 1
    assert peak[0] < 16                         # refused before expanding


def test_hash_id_trace_total_is_bounded_before_expansion(tmp_path):
    # 129 requests of 2**24 tokens pass the per-request bound but not the 2**31 total.
    p = write(tmp_path / "huge.jsonl", [hash_line(i, 2**24, 0, [i]) for i in range(129)])
    with pytest.raises(ValueError, match=rf"{p}: 129 requests expand to 2,164,260,864 tokens, "
                                         r"over the bound of 2,147,483,648 \(2\*\*31\)"):
        read_hash_id_trace(p, block_size=2**24)
    assert len(read_hash_id_trace(p, block_size=2**24, limit=1, vocab_size=10)) == 1


def test_trace_request_size_bounds():
    with pytest.raises(ValueError, match="output_len 16,777,217 is over the bound"):
        TraceRequest("a", 0.0, (1,), output_len=2**24 + 1)
    with pytest.raises(ValueError, match="request 'a': prompt \\+ output length"):
        TraceRequest("a", 0.0, (1,) * 10, output_len=2**24 - 9)
    assert TraceRequest("a", 0.0, (1,) * 10, output_len=2**24 - 10).output_len == 2**24 - 10


@pytest.mark.parametrize("make, names", [
    (lambda: support(num_users=100_000_000), ["num_users=100000000", "tokens", "2**31"]),
    (lambda: make_workload("multiturn", num_users=10**7, turns=50), ["num_users=10000000",
                                                                     "turns=50", "tokens"]),
    (lambda: load_workload("support", rag_fraction=1e308), ["rag_fraction=1e+308",
                                                            "more than"]),
    (lambda: fewshot(num_questions=10**6, preamble_len=10**4), ["num_questions=1000000",
                                                                "10,400,010,000 tokens"]),
    (lambda: fewshot(preamble_len=2**24, num_questions=1), ["preamble_len=16777216",
                                                           "request of up to", "2**24"]),
    (lambda: burst(num_requests=2**25, prefix_len=0, suffix_len=1, output_len=(0, 0)),
     ["num_requests=33554432", "33,554,432 requests", "2**24"]),
    (lambda: tree(depth=10**9), ["depth=1000000000", "more than", "tokens"]),
    (lambda: tree(num_trees=1, branching=1, depth=10**6, root_len=1), ["depth=1000000",
                                                                       "tokens"]),
    (lambda: rag(num_docs=10**6, doc_len=10**4), ["num_docs=1000000", "doc_len=10000"]),
    (lambda: rag(num_docs=2**30, doc_len=1), ["num_docs=1073741824", "2**24) documents"]),
])
def test_absurd_generator_parameters_refused_before_generating(make, names):
    with peak_mib() as peak, pytest.raises(ValueError) as e:
        make()
    assert all(n in str(e.value) for n in names), str(e.value)
    assert "over the bound" in str(e.value) and peak[0] < 16    # refused before generating


def test_vocab_size_bounded_by_32_bit_ids():
    with pytest.raises(ValueError, match="vocab_size must be <= 2\\*\\*32"):
        burst(vocab_size=2**32 + 1)
    assert len(burst(num_requests=2, vocab_size=2**32)) == 2


# ---- empty files ---------------------------------------------------------------------------

def test_empty_and_header_only_files_give_empty_workloads(tmp_path):
    empty = write(tmp_path / "empty.jsonl", [])
    blank = write(tmp_path / "blank.jsonl", ["", "   "])
    for p in (empty, blank):
        assert trace_format(p) == "empty"
        w = load_workload(p)
        assert len(w) == 0 and w.skipped == 0 and w.meta == {"source": str(p)}
        assert w.duration == 0.0 and w.num_prompt_tokens == 0
        # no record, no kind: any reader's options are accepted
        assert len(load_workload(p, block_size=64, tokenizer=object(), skip_bad=True)) == 0
        with pytest.raises(ValueError, match="unknown parameter 'blok_size'"):
            load_workload(p, blok_size=64)
        assert len(read_hash_id_trace(p)) == 0
    head = tmp_path / "head.jsonl"
    write_jsonl(Workload("named", [], block_size=16, meta={"seed": 1}), head)
    assert trace_format(head) == "empty"
    w = load_workload(head)
    assert (w.name, len(w), w.block_size) == ("named", 0, 16)
    assert w.meta == {"seed": 1, "source": str(head)}


# ---- time scale ----------------------------------------------------------------------------

def test_scaled_multiplies_every_arrival_exactly():
    w = multiturn(num_users=4, turns=3, rate=2.0)
    half = w.scaled(0.5)
    assert [r.arrival for r in half] == [r.arrival * 0.5 for r in w]
    assert [r.id for r in half] == [r.id for r in w]
    assert [(r.prompt, r.output, r.session) for r in half] == \
        [(r.prompt, r.output, r.session) for r in w]
    assert half.meta == {**w.meta, "time_scale": 0.5} and "time_scale" not in w.meta
    assert half.duration == w.duration * 0.5 and half.name == w.name
    back = half.scaled(3)
    assert [r.arrival for r in back] == [r.arrival * 0.5 * 3 for r in w]
    assert back.meta["time_scale"] == 1.5
    # the scaled workload round-trips with its time scale
    assert half.scaled(1.0) == half


def test_scaled_keeps_order_skipped_and_block_size():
    reqs = [TraceRequest(f"r{i}", t, (1, 2), output_len=1)
            for i, t in enumerate([0.0, 0.1, 0.1, 0.3, 1e-300])]
    w = Workload("w", reqs, skipped=2, block_size=64)
    s = w.scaled(1e-10)
    assert [r.id for r in s] == [r.id for r in w] and (s.skipped, s.block_size) == (2, 64)
    assert [r.arrival for r in s] == [r.arrival * 1e-10 for r in w]


@pytest.mark.parametrize("factor", [0, -1, float("nan"), float("inf"), True, "2"])
def test_scaled_rejects_bad_factors(factor):
    with pytest.raises(ValueError, match="time scale factor"):
        burst(num_requests=2).scaled(factor)


def test_scaled_refuses_overflow():
    w = Workload("w", [TraceRequest("a", 1e300, (1,), output_len=1)])
    with pytest.raises(ValueError, match="time scale factor 1e\\+300 takes the last arrival"):
        w.scaled(1e300)


# ---- source ----------------------------------------------------------------------------

def test_every_workload_names_its_source(tmp_path, blocks64):
    gen = make_workload("burst", num_requests=2)
    assert gen.meta["source"] == "generator:burst"
    assert tree(num_trees=1, depth=1).meta["source"] == "generator:tree"
    assert load_workload("rag", num_requests=2, num_docs=3).meta["source"] == "generator:rag"
    assert read_hash_id_trace(blocks64, block_size=64).meta["source"] == str(blocks64)
    plain = write(tmp_path / "plain.jsonl", [rec()])
    assert load_workload(plain).meta["source"] == str(plain)
    # a radixkv JSONL file keeps the source it was written from
    saved = tmp_path / "saved.jsonl"
    write_jsonl(gen, saved)
    assert load_workload(saved).meta["source"] == "generator:burst"
    assert load_workload(saved).scaled(2).meta["source"] == "generator:burst"
