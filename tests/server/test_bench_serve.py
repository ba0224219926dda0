"""The bench-serve client: SSE parsing, a stream's timings, the summary arithmetic, send times,
the closed loop's order, a fake server through httpx's mock transport, and a run against a
real `radixkv serve --executor sim`."""
from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from radixkv.bench.client import (BenchConfig, RequestRecord, SSEParser, StreamState,
                                 run_benchmark_async, send_times, summarize)
from radixkv.cli import main
from radixkv.bench.process import ServerProcess
from radixkv.workloads.sessions import SessionQueue
from radixkv.workloads import TraceRequest, Workload, fewshot


def _req(i: int, arrival: float = 0.0, session: str | None = None, out: int = 3):
    return TraceRequest(f"r{i}", arrival, (1, 2, 3, i), output_len=out, session=session)


# ---- SSE and stream state -------------------------------------------------------------------
def test_sse_parser_joins_data_lines_and_skips_comments():
    p = SSEParser()
    got = [p.feed(line) for line in [": keep-alive", "data: {\"a\":", "data:1}", "",
                                     "event: x", "data: [DONE]\r\n", "\r\n", ""]]
    assert [g for g in got if g is not None] == ['{"a":\n1}', "[DONE]"]
    assert p.feed("data: tail") is None and p.flush() == "tail" and p.flush() is None


def _chunk(text, finish=None, usage=None):
    d = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        d = {"choices": [], "usage": usage}
    return json.dumps(d)


def test_stream_state_times_content_chunks_only():
    s = StreamState(start=10.0)
    s.on_event(_chunk("a"), 10.5)
    s.on_event(_chunk(""), 10.75)                 # a token that decodes to nothing yet
    s.on_event(_chunk("b"), 11.0)
    s.on_event(_chunk("", finish="length"), 11.5)  # the finishing chunk is no token
    s.on_event(_chunk(None, usage={"prompt_tokens": 4, "completion_tokens": 3,
                                   "prompt_tokens_details": {"cached_tokens": 2}}), 11.6)
    s.on_event("[DONE]", 11.7)
    rec = s.record(_req(0), sent=0.25, end=12.0)
    assert rec.ok and rec.ttft == 0.5 and rec.itls == [0.25, 0.25] and rec.e2e == 2.0
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (4, 2, 3)


def test_stream_state_without_usage_and_errors():
    s = StreamState(start=0.0)
    s.on_event(_chunk("x"), 1.0)
    s.on_event("[DONE]", 2.0)
    rec = s.record(_req(7), 0.0, 2.0)
    # no usage: the prompt's length, no cached tokens, one token per content chunk
    assert rec.ok and (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (4, 0, 1)
    s = StreamState(start=0.0)
    s.on_event(json.dumps({"error": {"message": "too long"}}), 1.0)
    assert s.record(_req(0), 0.0, 1.0).error == "too long"
    s = StreamState(start=0.0)
    s.on_event("{not json", 1.0)
    assert s.error.startswith("not a JSON chunk")
    s = StreamState(start=0.0)
    s.on_event(_chunk("x"), 1.0)
    assert "without data: [DONE]" in s.record(_req(0), 0.0, 1.0).error


# ---- summary arithmetic ---------------------------------------------------------------------
def test_summary_exact_values():
    recs = [RequestRecord("a", 0.0, ttft=0.1, itls=[0.01, 0.03], e2e=1.0, prompt_tokens=100,
                          cached_tokens=60, output_tokens=3),
            RequestRecord("b", 0.5, ttft=0.3, itls=[0.02], e2e=2.0, prompt_tokens=50,
                          cached_tokens=0, output_tokens=2),
            RequestRecord("c", 0.7, error="HTTP 500: boom"),
            RequestRecord("d", 0.8, error="HTTP 500: boom")]
    s = summarize(recs, duration=2.5, requests=5)
    assert (s["requests"], s["completed"], s["errors"], s["not_sent"]) == (5, 2, 2, 1)
    assert s["request_throughput_req_s"] == 2 / 2.5 and s["output_tok_s"] == 5 / 2.5
    assert s["input_tok_s"] == 150 / 2.5
    assert s["ttft_mean"] == pytest.approx(0.2) and s["ttft_p50"] == pytest.approx(0.2)
    assert s["ttft_p90"] == pytest.approx(0.28) and s["ttft_p99"] == pytest.approx(0.298)
    assert s["itl_mean"] == pytest.approx(0.02) and s["itl_p50"] == pytest.approx(0.02)
    assert s["itl_p99"] == pytest.approx(0.0298)
    assert s["e2e_mean"] == 1.5 and s["e2e_p90"] == pytest.approx(1.9)
    assert (s["prompt_tokens"], s["cached_tokens"], s["output_tokens"]) == (150, 60, 5)
    assert s["cached_token_rate"] == pytest.approx(0.4)
    assert s["error_examples"] == {"HTTP 500: boom": 2}


def test_summary_of_nothing_completed_has_no_figures():
    s = summarize([RequestRecord("a", 0.0, error="x")], duration=0.0)
    assert s["completed"] == 0 and s["errors"] == 1 and s["ttft_p99"] is None
    assert s["output_tok_s"] is None and s["cached_token_rate"] is None


# ---- when requests are sent -----------------------------------------------------------------
def test_send_times():
    w = Workload("w", [_req(0, 10.0), _req(1, 12.0), _req(2, 14.0)])
    assert send_times(w, None) == [0.0, 2.0, 4.0]
    assert send_times(w, math.inf) == [0.0, 0.0, 0.0]
    assert send_times(w, 2.0) == [0.0, 0.5, 1.0]          # 2 gaps in 1 s: 2 requests/s
    together = Workload("t", [_req(i) for i in range(3)])
    assert send_times(together, 4.0) == [0.0, 0.25, 0.5]


def test_session_queue_keeps_a_session_on_one_client_in_order():
    q = SessionQueue(["a", "b", "a", None, "b", "a"], num_clients=2)
    assert (q.take(0), q.take(1)) == (0, 1)     # each client takes a new session
    assert q.take(0) == 2                       # its own session's next turn
    assert q.take(0) == 3                       # a sessionless request, nobody's
    assert q.take(1) == 4 and q.take(0) == 5 and q.take(1) is None and q.take(0) is None


@pytest.mark.parametrize("kw, match", [
    (dict(base_url="localhost:8000"), "not an http"),
    (dict(base_url="http://x", request_rate=0.0), "--request-rate 0.0"),
    (dict(base_url="http://x", request_rate=float("nan")), "--request-rate nan"),
    (dict(base_url="http://x", request_rate=2.0, max_concurrency=4), "one or the other"),
    (dict(base_url="http://x", timeout=-1.0), "--timeout -1.0"),
    (dict(base_url="http://x", duration_limit=math.inf), "--duration-limit inf")])
def test_config_refuses_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**kw)


def test_base_url_may_end_in_v1():
    assert BenchConfig("http://h:1/v1/").base_url == "http://h:1"


# ---- a fake server --------------------------------------------------------------------------
def _fake_server(seen: list):
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake"}]})
        body = json.loads(request.content)
        seen.append(body)
        if body["prompt"][-1] == 13:
            return httpx.Response(500, text="boom")
        if body["prompt"][-1] == 14:
            await asyncio.sleep(5)
        n = body["max_tokens"]
        lines = [f"data: {_chunk('t')}\n\n" for _ in range(n)]
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": 2}}
        lines += [f"data: {_chunk(None, usage=usage)}\n\n", "data: [DONE]\n\n"]
        return httpx.Response(200, text="".join(lines),
                              headers={"content-type": "text/event-stream"})
    return httpx.MockTransport(handler)


def test_fake_server_run_records_errors_and_timeouts():
    seen: list = []
    w = Workload("w", [_req(0, out=0), _req(1), _req(13), _req(14)])
    cfg = BenchConfig("http://fake", request_rate=math.inf, timeout=0.5)
    res = asyncio.run(run_benchmark_async(w, cfg, transport=_fake_server(seen)))
    assert res.model == "fake"
    by_id = {r.id: r for r in res.records}
    assert by_id["r0"].ok and by_id["r0"].output_tokens == 1 and by_id["r0"].cached_tokens == 2
    assert by_id["r13"].error == "HTTP 500: boom"
    assert by_id["r14"].error == "timed out after 0.5 s"
    assert res.summary["completed"] == 2 and res.summary["errors"] == 2
    sent = {b["prompt"][-1]: b for b in seen}
    assert sent[0]["max_tokens"] == 1 and sent[1]["max_tokens"] == 3
    assert all(b["stream"] and b["ignore_eos"] and b["temperature"] == 0 and
               b["stream_options"] == {"include_usage": True} for b in seen)


def test_duration_limit_stops_the_run():
    w = Workload("w", [_req(14, 0.0), _req(1, 0.0), _req(2, 30.0)])
    cfg = BenchConfig("http://fake", model="m", duration_limit=0.3)
    res = asyncio.run(run_benchmark_async(w, cfg, transport=_fake_server([])))
    s = res.summary
    assert (s["completed"], s["errors"], s["not_sent"]) == (1, 1, 1)
    assert "in flight at the --duration-limit" in next(r.error for r in res.records if r.error)


# ---- against radixkv serve ------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_server():
    with ServerProcess(["--executor", "sim", "--model", "llama-3-8b", "--enable-metrics"],
                       startup_timeout=60) as srv:
        yield srv


def test_bench_serve_cli_against_sim_server(sim_server, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench-serve", "--base-url", sim_server.base_url, "fewshot", "--num-prompts",
               "6", "--vocab-size", "256", "--max-concurrency", "3", "--json", str(out)])
    assert rc == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    s = doc["results"][0]
    assert s["completed"] == 6 and s["errors"] == 0 and s["cached_tokens"] > 0
    assert doc["units"]["itl_p99"] == "s" and doc["units"]["request_throughput_req_s"] == \
        "requests/s" and doc["max_concurrency"] == 3


def test_library_against_sim_server(sim_server):
    w = fewshot(num_questions=5, preamble_len=300, output_len=(2, 4), vocab_size=256)
    res = asyncio.run(run_benchmark_async(w, BenchConfig(sim_server.base_url,
                                                         request_rate=math.inf)))
    s = res.summary
    assert s["completed"] == 5 and s["errors"] == 0 and s["cached_tokens"] > 0
    assert s["output_tokens"] == w.num_output_tokens and s["ttft_p50"] > 0


def test_bench_serve_cli_refuses_bad_input(capsys):
    rc = main(["bench-serve", "--base-url", "ftp://x", "fewshot"])
    assert rc == 2 and "not an http" in capsys.readouterr().err
    rc = main(["bench-serve", "--base-url", "http://127.0.0.1:9", "fewshot", "--num-prompts",
               "1"])
    assert rc == 2 and "cannot reach http://127.0.0.1:9/v1/models" in capsys.readouterr().err


def test_text_prompts_keep_equal_prompts_equal_and_shared_prefixes_shared():
    from radixkv.bench.client import as_text
    a, b = [5, 6, 7, 100, 3], [5, 6, 7, 100, 4]
    assert as_text(a) == as_text(list(a)) and as_text(a)[:4] == as_text(b)[:4]
    assert as_text(a) != as_text(b) and as_text(range(94)) == "".join(map(chr, range(33, 127)))
    assert as_text([94]) == as_text([0]) == "!"          # ids meet modulo 94


def test_a_text_run_sends_text_the_server_tokenizes():
    from tests.server._helpers import running_server
    wl = Workload("t", [TraceRequest(f"r{i}", 0.0, [1, 2, 3, 4, 5, 6, 7, i], output_len=2)
                        for i in range(3)])
    with running_server(executor="sim", model="llama-3-8b") as (url, _):
        res = asyncio.run(run_benchmark_async(wl, BenchConfig(url, text=True)))
    assert res.summary["completed"] == 3
    assert res.summary["prompt_tokens"] == 3 * 9          # <bos> and one byte per character
