"""Measured timing (radixkv.sim.tables, radixkv.sim.measured): the tables agree with the
estimator they were read from, the step composition is the documented one, the disk cache is
used and survives damage, and the roofline stands in where the tables do not reach."""
from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.sim.costmodel import CostModel
from radixkv.sim.measured import MeasuredCostModel, named_cost
from radixkv.sim.tables import (CTX_NEW, CTX_PREFIX, DEC_BATCH, DEC_CTX, TOKENS, Timing,
                                load_table, table_path)

MODEL = "meta-llama/Meta-Llama-3.1-8B"


@pytest.fixture(scope="module")
def engine():
    from aiconfigurator_core.sdk import EngineHandle
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return EngineHandle.compile(MODEL, "h100_sxm", "vllm", backend_version="0.24.0", tp_size=1)


@pytest.fixture(scope="module")
def cost() -> MeasuredCostModel:
    c = named_cost("llama-3-8b", "h100-sxm")
    assert isinstance(c, MeasuredCostModel)
    return c


def test_default_is_the_newest_vllm_table(cost):
    t = cost.table
    assert (t.model, t.system, t.backend, t.version, t.tp) == (MODEL, "h100_sxm", "vllm",
                                                                "0.24.0", 1)
    assert cost.timing == "measured: aiconfigurator-core 0.12.0 vllm 0.24.0 tables"
    assert cost.step_overhead_s == 0.0


def test_grid_points_reproduce_the_estimator(cost, engine):
    # one segment on the grid: the estimator's own prefill figure, to rounding
    for n, p in ((512, 0), (4096, 32768), (2048, 4096), (8192, 0)):
        want = engine.predict_prefill_latency(1, p + n, prefix=p)
        assert cost.step_time([(p, n)], ()) * 1e3 == pytest.approx(want, rel=1e-9)
    for b, c in ((1, 1024), (32, 4096), (128, 8192)):
        assert cost.step_time((), [c] * b) * 1e3 == pytest.approx(
            engine.decode_step_latency(b, c, 2), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20_000), p=st.integers(0, 200_000))
def test_off_grid_prefill_within_ten_percent(cost, engine, n, p):
    want = engine.predict_prefill_latency(1, p + n, prefix=p)
    assert cost.step_time([(p, n)], ()) * 1e3 == pytest.approx(want, rel=0.10)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 600), c=st.integers(1, 100_000))
def test_off_grid_decode_within_five_percent(cost, engine, b, c):
    assert cost.step_time((), [c] * b) * 1e3 == pytest.approx(
        engine.decode_step_latency(b, c, 2), rel=0.05)


def test_mixed_step_is_shared_plus_attention(cost):
    segs, ctxs = [(0, 300), (4096, 700), (100, 5)], [1000, 3000, 20]
    a0 = cost.ctx_attn_ms(1, 0)
    want = (cost.shared_ms(300 + 700 + 5 + 3) + a0
            + sum(max(cost.ctx_attn_ms(n, p) - a0, 0.0) for p, n in segs)
            + cost.dec_attn_ms(3, 4020)) / 1e3
    assert cost.step_time(segs, ctxs) == want
    assert cost.step_time((), ()) == 0.0
    # a batch of equal segments pays the attention kernels' fixed cost once
    one = cost.step_time([(0, 128)], ())
    assert cost.step_time([(0, 128)] * 4, ()) < 4 * one


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=300))
def test_decode_step_time_is_step_time_to_the_bit(cost, ctxs):
    assert cost.decode_step_time(len(ctxs), sum(ctxs), max(ctxs)) == cost.step_time((), ctxs)


def test_step_time_rejects_bad_segments(cost):
    with pytest.raises(ValueError, match="new_len must be an int >= 1, got 0"):
        cost.step_time([(0, 0)], ())
    with pytest.raises(ValueError, match="decode context_len must be an int >= 0, got -1"):
        cost.step_time((), [-1])


def test_capacity_is_what_the_engine_allocates(cost):
    # the figure DynoSim runs 8 x H100 replicas of Llama-3.1-8B with: 80 GiB x 0.9 less
    # weights (16.06 GB), activations and runtime reserve, at 128 KiB per token
    t = cost.table
    assert t.kv_capacity_tokens == 432_992
    assert t.kv_memory["memory_fraction"] == 0.9
    assert t.kv_memory["kv_bytes_per_token"] == cost.model_spec.kv_bytes_per_token_per_gpu
    sgl = named_cost("llama-3-8b", "h100-sxm", timing="sglang").table
    assert (sgl.backend, sgl.version, sgl.kv_capacity_tokens) == ("sglang", "0.5.14", 382_703)
    assert sgl.kv_memory["memory_fraction"] == pytest.approx(0.836)


def test_uncovered_pairs_fall_back_to_the_roofline_and_say_so():
    c = named_cost("qwen2-7b", "h100-sxm")
    assert type(c) is CostModel
    assert c.timing == ("roofline: 400 TFLOP/s assumed; no vllm tables for "
                        "qwen2-7b@h100-sxm")
    roof = named_cost("llama-3-8b", "h100-sxm", timing="roofline")
    assert type(roof) is CostModel and roof.timing == "roofline: 400 TFLOP/s assumed"
    assert roof.step_time([(0, 512)], ()) == CostModel.named("llama-3-8b", "h100-sxm") \
        .step_time([(0, 512)], ())


@pytest.mark.parametrize("text, error", [
    ("vllm:", "--timing 'vllm:': expected roofline"),
    ("tensorrt", "--timing 'tensorrt': expected roofline"),
    ("roofline:1", "--timing 'roofline:1': expected roofline"),
])
def test_bad_timing_names_the_value(text, error):
    with pytest.raises(ValueError, match=error):
        Timing.parse(text)


def test_unknown_version_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"--timing vllm:9\.9\.9: aiconfigurator-core has no "
                                         r"tables for meta-llama/Meta-Llama-3.1-8B on h100_sxm"):
        named_cost("llama-3-8b", "h100-sxm", timing="vllm:9.9.9")
    assert not (tmp_path / "timing").exists() or not any((tmp_path / "timing").iterdir())


def test_disk_cache_is_read_and_rebuilt_when_damaged(tmp_path, monkeypatch, cost):
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
    path = table_path(MODEL, "h100_sxm", "vllm", "0.24.0", 1)
    assert path.parent.parent == tmp_path and not path.exists()
    built = load_table(MODEL, "h100_sxm", "vllm", "0.24.0", 1)
    assert built == cost.table and path.is_file()
    doc = json.loads(path.read_text())
    assert (doc["tokens"], doc["ctx_new"], doc["ctx_prefix"], doc["dec_batch"],
            doc["dec_ctx"]) == (TOKENS, CTX_NEW, CTX_PREFIX, DEC_BATCH, DEC_CTX)
    doc["shared_ms"][0] = 123.0                   # read back as written: no rebuild
    path.write_text(json.dumps(doc))
    assert load_table(MODEL, "h100_sxm", "vllm", "0.24.0", 1).shared_ms[0] == 123.0
    path.write_text(doc.__repr__()[:100])         # damaged: rebuilt whole
    assert load_table(MODEL, "h100_sxm", "vllm", "0.24.0", 1) == cost.table
    assert json.loads(path.read_text())["shared_ms"][0] == cost.table.shared_ms[0]


def test_an_unwritable_cache_still_prices_the_run(tmp_path, monkeypatch, cost, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(blocker))      # timing/ cannot be made under it
    with caplog.at_level(logging.WARNING, logger="radixkv.sim.tables"):
        table = load_table(MODEL, "h100_sxm", "vllm", "0.24.0", 1)
    assert table == cost.table
    assert "timing table not cached at" in caplog.text
    assert blocker.read_text() == "not a folder"
