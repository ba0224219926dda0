"""TraceRequest validation, JSON round trips, and the JSONL reader's error reporting."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.workloads import (TraceFormatError, TraceRequest, Workload, read_jsonl,
                               write_jsonl)


def req(id: str = "a", arrival: float = 0.0, **kw) -> TraceRequest:
    kw.setdefault("prompt", (1, 2, 3))
    kw.setdefault("output", (4, 5))
    return TraceRequest(id=id, arrival=arrival, **kw)


def test_normalises_sequences_and_infers_output_len():
    r = TraceRequest("a", 1, [1, 2], output=np.array([3, 4, 5]))
    assert r.prompt == (1, 2) and r.output == (3, 4, 5) and r.output_len == 3
    assert isinstance(r.arrival, float) and type(r.output[0]) is int
    assert TraceRequest("b", 0.5, (7,), output_len=9).output is None


@pytest.mark.parametrize("kw, field, value", [
    (dict(prompt=(1, -2)), "prompt", "-2"),
    (dict(prompt=(1, True)), "prompt", "True"),
    (dict(prompt=(1, 2.0)), "prompt", "2.0"),
    (dict(prompt=()), "prompt", "empty"),
    (dict(output=(1, -5)), "output", "-5"),
    (dict(output=(1, 2), output_len=3), "output_len", "3"),
    (dict(output=None), "output_len", "required"),
    (dict(output=None, output_len=-1), "output_len", "-1"),
    (dict(arrival=-0.5), "arrival", "-0.5"),
    (dict(arrival=float("nan")), "arrival", "nan"),
    (dict(id=""), "id", "''"),
    (dict(priority=1.5), "priority", "1.5"),
    (dict(session=3), "session", "3"),
])
def test_validation_names_field_and_value(kw, field, value):
    base = dict(id="a", arrival=0.0, prompt=(1, 2, 3), output=(4, 5))
    base.update(kw)
    with pytest.raises(ValueError) as e:
        TraceRequest(**base)
    assert field in str(e.value) and value in str(e.value)


def test_frozen():
    with pytest.raises(AttributeError):
        req().arrival = 3.0  # type: ignore[misc]


tok = st.lists(st.integers(0, 2**31), min_size=1, max_size=20)
name = st.none() | st.text(max_size=5)


@settings(max_examples=60, deadline=None)
@given(tok, st.none() | st.lists(st.integers(0, 99), max_size=5), name, name,
       st.integers(-3, 3), st.floats(0, 1e6))
def test_json_round_trip(prompt, output, extra, session, prio, arrival):
    r = TraceRequest("x", arrival, prompt, output, None if output is not None else 4,
                     extra_key=extra, priority=prio, session=session)
    assert TraceRequest.from_json(json.loads(json.dumps(r.to_json()))) == r


def test_from_json_rejects_unknown_and_missing():
    with pytest.raises(ValueError, match="unknown field 'promt'"):
        TraceRequest.from_json({"id": "a", "arrival": 0, "prompt": [1], "promt": [2]})
    with pytest.raises(ValueError, match="missing field 'prompt'"):
        TraceRequest.from_json({"id": "a", "arrival": 0})
    with pytest.raises(ValueError, match="JSON list"):
        TraceRequest.from_json({"id": "a", "arrival": 0, "prompt": "12", "output_len": 1})


def test_workload_sorts_stably_and_rejects_duplicate_ids():
    w = Workload("w", [req("c", 2.0), req("a", 1.0), req("b", 1.0)])
    assert [r.id for r in w] == ["a", "b", "c"] and len(w) == 3
    assert w.num_prompt_tokens == 9 and w.num_output_tokens == 6 and w.duration == 1.0
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        Workload("w", [req("a"), req("a", 1.0)])


def test_jsonl_round_trip_keeps_everything(tmp_path):
    w = Workload("demo", [req("a", 0.25, routing_key="k", cache_salt="s"),
                          req("b", 1.5, output=None, output_len=7)],
                 block_size=16, meta={"seed": 3, "msg_len": [1, 2], "rate": None})
    p = tmp_path / "w.jsonl"
    write_jsonl(w, p)
    assert read_jsonl(p) == w
    write_jsonl(w, p, header=False)
    back = read_jsonl(p)
    assert back.requests == w.requests and back.name == "w" and back.meta == {}


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")


GOOD = json.dumps({"id": "a", "arrival": 0, "prompt": [1, 2], "output_len": 3})


@pytest.mark.parametrize("bad, what", [
    ("{not json", "Expecting property name"),
    ('[1, 2]', "expected a JSON object"),
    ('{"id": "b", "arrival": 0}', "missing field 'prompt'"),
    ('{"id": "b", "arrival": 0, "prompt": [1, -1], "output_len": 1}', "negative token id -1"),
    ('{"id": "b", "arrival": -1, "prompt": [1], "output_len": 1}', "arrival"),
    ('{"id": "a", "arrival": 0, "prompt": [1], "output_len": 1}', "duplicate request id 'a'"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, what):
    p = tmp_path / "t.jsonl"
    _write_lines(p, [GOOD, "", bad])
    with pytest.raises(TraceFormatError) as e:
        read_jsonl(p)
    msg = str(e.value)
    assert f"{p}:3:" in msg and what in msg
    w = read_jsonl(p, skip_bad=True)
    assert w.skipped == 1 and [r.id for r in w] == ["a"]


def test_trace_format_error_is_value_error():
    assert issubclass(TraceFormatError, ValueError)
