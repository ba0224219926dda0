"""EngineReport: the windowed timeline series, exactly on a hand-made report, and a summary()
that is strict JSON for empty, zero-makespan and normal runs."""
import json
import math

import numpy as np
import pytest

from radixkv.config import EngineConfig
from radixkv.engine.engine import Engine
from radixkv.engine.metrics import EngineReport, RequestRecord
from radixkv.sched.request import Request
from radixkv.sim.executor import SimExecutor

SUMMARY_KEYS = ["name", "requests", "prompt_tokens", "cached_tokens", "hit_rate", "prefill_tokens",
                "recomputed_tokens", "output_tokens", "ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50",
                "e2e_p90", "e2e_p99", "tpot_mean", "throughput_tok_s", "total_tok_s",
                "evicted_tokens", "retractions", "held_back", "lpm_fallbacks", "peak_kv_usage",
                "peak_queue", "makespan_s", "steps"]


def rec(rid, arrival, admit, prompt, cached, finish=None, output=2):
    finish = admit + 1.0 if finish is None else finish
    return RequestRecord(rid, arrival, admit - arrival, admit - arrival + 0.1, 0.5, finish - arrival,
                         prompt, output, cached, prompt - cached, 0, 0, admit)


def report(records, timeline, makespan=6.0, capacity=400, name="hand"):
    return EngineReport(name, records, 0, 0, 0, 0, len(timeline.get("t", [])), makespan, capacity,
                        timeline)


def tiny():
    # admitted at 0.5, 1.0 and 3.0 (listed out of admission order on purpose)
    recs = [rec("c", 2.0, 3.0, 50, 50), rec("a", 0.0, 0.5, 100, 0), rec("b", 1.0, 1.0, 100, 60)]
    tl = {"t": [0.5, 1.0, 2.0, 3.0, 6.0], "waiting": [1, 0, 1, 0, 0], "running": [1, 2, 1, 2, 0],
          "kv_used": [100, 200, 150, 250, 0]}
    return report(recs, tl)


def test_timeline_series_exact_on_a_hand_made_report():
    s = tiny().timeline_series(2.0)
    assert set(s) == {"t", "hit_rate", "waiting", "running", "kv_used", "kv_usage"}
    np.testing.assert_array_equal(s["t"], [0.5, 1.0, 2.0, 3.0, 6.0])
    # windows (t-2, t]: {a} 0/100, {a,b} 60/200, {a,b} 60/200, {c} 50/50 (b at 1.0 is out), none
    np.testing.assert_array_equal(s["hit_rate"], [0.0, 0.3, 0.3, 1.0, np.nan])
    np.testing.assert_array_equal(s["waiting"], [1, 0, 1, 0, 0])
    np.testing.assert_array_equal(s["running"], [1, 2, 1, 2, 0])
    np.testing.assert_array_equal(s["kv_used"], [100, 200, 150, 250, 0])
    np.testing.assert_array_equal(s["kv_usage"], [0.25, 0.5, 0.375, 0.625, 0.0])
    assert all(len(v) == 5 for v in s.values())


def test_timeline_series_wide_window_is_the_running_hit_rate():
    s = tiny().timeline_series(100.0)
    np.testing.assert_array_equal(s["hit_rate"], [0.0, 0.3, 0.3, 110 / 250, 110 / 250])


def test_timeline_series_empty_report_and_bad_window():
    empty = report([], {"t": [], "waiting": [], "running": [], "kv_used": []}, makespan=0.0)
    s = empty.timeline_series(1.0)
    assert all(len(v) == 0 for v in s.values())
    with pytest.raises(ValueError, match="window must be positive"):
        tiny().timeline_series(0.0)


def test_record_without_first_admit_falls_back_to_arrival_plus_queue_time():
    twelve = RequestRecord("x", 2.0, 0.25, 0.5, 0.1, 1.0, 10, 3, 4, 6, 0, 0)
    assert twelve.first_admit is None and twelve.admitted == 2.25
    assert rec("y", 1.0, 1.5, 10, 0).admitted == 1.5
    assert RequestRecord._fields[:12] == ("rid", "arrival", "queue_time", "ttft", "tpot", "e2e",
                                          "prompt_tokens", "output_tokens", "cached_tokens",
                                          "prefill_tokens", "recomputed_tokens", "retractions")
    assert RequestRecord._fields[12] == "first_admit"


def engine_report():
    cfg = EngineConfig(kv_capacity=1024)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())
    for i in range(4):
        eng.add_request(Request(f"r{i}", list(range(64)) + [1000 + i] * 8, 4, arrival=0.01 * i))
    return eng, eng.run_until_idle()


def test_engine_records_carry_the_first_admission_time():
    eng, rep = engine_report()
    by_id = {r.rid: r for r in eng.finished}
    for r in rep.records:
        assert r.first_admit == by_id[r.rid].first_admit
        assert r.admitted == pytest.approx(r.arrival + r.queue_time)
    s = rep.timeline_series(0.5)
    assert len(s["t"]) == rep.steps and not np.isnan(s["hit_rate"]).all()


def test_summary_of_a_normal_run_is_strict_json_with_every_key():
    _, rep = engine_report()
    s = rep.summary()
    assert list(s) == SUMMARY_KEYS
    json.dumps(s, allow_nan=False)
    assert s["requests"] == 4 and s["cached_tokens"] > 0
    assert s["hit_rate"] == s["cached_tokens"] / s["prompt_tokens"]
    assert s["throughput_tok_s"] == s["output_tokens"] / rep.makespan
    assert s["total_tok_s"] == (s["prompt_tokens"] + s["output_tokens"]) / rep.makespan
    assert s["ttft_p50"] == float(np.percentile([r.ttft for r in rep.records], 50))
    assert s["tpot_mean"] == float(np.mean([r.tpot for r in rep.records]))
    assert 0 < s["peak_kv_usage"] <= 1 and s["makespan_s"] == rep.makespan


def test_summary_of_an_empty_report_is_strict_json():
    empty = report([], {"t": [], "waiting": [], "running": [], "kv_used": []}, makespan=0.0)
    s = empty.summary()
    assert list(s) == SUMMARY_KEYS
    json.dumps(s, allow_nan=False)
    for k in ("ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p90", "e2e_p99", "tpot_mean"):
        assert s[k] is None, k
    assert s["hit_rate"] == 0.0 and s["throughput_tok_s"] == 0.0 and s["total_tok_s"] == 0.0
    assert s["peak_kv_usage"] == 0.0 and s["peak_queue"] == 0 and s["requests"] == 0


def test_summary_over_a_zero_makespan_reports_no_rate_rather_than_inf():
    rep = report([rec("a", 0.0, 0.0, 10, 0, finish=0.0)],
                 {"t": [0.0], "waiting": [0], "running": [1], "kv_used": [16]}, makespan=0.0)
    s = rep.summary()
    json.dumps(s, allow_nan=False)
    assert s["throughput_tok_s"] is None and s["total_tok_s"] is None
    assert s["ttft_p50"] == 0.1 and s["makespan_s"] == 0.0


def test_summary_never_holds_a_non_finite_float():
    rep = report([rec("a", 0.0, 0.0, 10, 0, finish=math.inf)], {"t": [1.0], "waiting": [0],
                 "running": [1], "kv_used": [16]}, makespan=math.inf)
    s = rep.summary()
    json.dumps(s, allow_nan=False)
    assert s["e2e_p50"] is None and s["makespan_s"] is None
