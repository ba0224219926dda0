"""Chat-log input: millisecond timestamps, missing content, malformed lines, tokenizer paths."""
import json

import pytest

from radixkv.model.tokenizer_files import write_tokenizer_dir
from radixkv.tokenizer import ByteTokenizer
from radixkv.workloads import TraceFormatError, load_workload, read_chat_log


def _log(tmp_path, rows, name="chat.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _msg(text):
    return [{"role": "user", "content": text}]


def test_regression_epoch_milliseconds_detected(tmp_path):
    # a 20-minute log in epoch ms used to be read as seconds: 14 days
    p = _log(tmp_path, [{"messages": _msg("a"), "timestamp": 1733450000000},
                        {"messages": _msg("b"), "timestamp": 1733451200000}])
    w = read_chat_log(p, ByteTokenizer())
    assert [r.arrival for r in w] == [0.0, 1200.0]
    assert w.meta["timestamp_unit"] == "ms" and w.meta["timestamp_unit_detected"] is True
    forced = read_chat_log(p, ByteTokenizer(), timestamp_unit="s")
    assert [r.arrival for r in forced] == [0.0, 1200000.0]
    assert forced.meta["timestamp_unit_detected"] is False


def test_regression_seconds_stay_seconds_and_mixed_sizes_refused(tmp_path):
    p = _log(tmp_path, [{"messages": _msg("a"), "timestamp": 1733450000},
                        {"messages": _msg("b"), "timestamp": 1733450060}])
    w = read_chat_log(p, ByteTokenizer())
    assert [r.arrival for r in w] == [0.0, 60.0] and w.meta["timestamp_unit"] == "s"
    assert [r.arrival for r in read_chat_log(p, ByteTokenizer(), timestamp_unit="ms")] == \
        [0.0, pytest.approx(0.06)]
    mixed = _log(tmp_path, [{"messages": _msg("a"), "timestamp": 1733450000},
                            {"messages": _msg("b"), "timestamp": 1733450060000}], "m.jsonl")
    with pytest.raises(ValueError, match=r"timestamps mix sizes: line 1 has 1.73345e\+09 "
                                         r"\(seconds\?\) and line 2"):
        read_chat_log(mixed, ByteTokenizer())
    with pytest.raises(ValueError, match="unknown timestamp unit 'us'; valid: s, ms"):
        read_chat_log(p, ByteTokenizer(), timestamp_unit="us")


def test_regression_message_without_content_refused(tmp_path):
    p = _log(tmp_path, [{"messages": _msg("a")},
                        {"messages": [{"role": "system", "content": "s"}, {"role": "user"}]}])
    with pytest.raises(TraceFormatError) as e:
        read_chat_log(p, ByteTokenizer())
    assert str(e.value) == (f"{p}:2: messages[1] (role 'user') has no 'content'; an empty "
                            f"message is written \"content\": \"\" or null; skip_bad=True skips "
                            f"such lines")
    w = read_chat_log(p, ByteTokenizer(), skip_bad=True)
    assert len(w) == 1 and w.skipped == 1


def test_regression_truncated_line_names_file_line_and_skip_bad(tmp_path):
    p = _log(tmp_path, [{"messages": _msg("a")}, '{"messages": [{"role": "user", "cont'])
    with pytest.raises(TraceFormatError) as e:
        read_chat_log(p, ByteTokenizer())
    assert str(e.value) == (f"{p}:2: not valid JSON (Unterminated string starting at, column "
                            f"32; the line looks cut short); skip_bad=True skips such lines")
    assert str(e.value.with_hint("--skip-bad skips such lines")).endswith(
        "the line looks cut short); --skip-bad skips such lines")


@pytest.mark.parametrize("as_file", [False, True])
def test_regression_load_workload_tokenizer_path(tmp_path, as_file):
    # a path used to reach str.encode: "LookupError: unknown encoding: <the prompt>"
    tok = write_tokenizer_dir(tmp_path / "tok", 259, 4096)
    p = _log(tmp_path, [{"messages": _msg("hi")}])
    w = load_workload(p, tokenizer=str(tok / "tokenizer.json") if as_file else str(tok))
    assert w[0].prompt == tuple(ByteTokenizer().encode("<|user|>\nhi\n<|assistant|>\n"))
    with pytest.raises(FileNotFoundError, match="tokenizer path 'nope/' does not exist"):
        load_workload(p, tokenizer="nope/")
