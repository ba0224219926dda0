"""`radixkv calibrate` then `radixkv validate` on tiny-llama (CPU), and their one-line errors."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main

pytest.importorskip("torch")


# A few seconds' grid for the commands' plumbing; the CPU grid itself is checked point by point
# below, its timing is `radixkv calibrate`'s own (60-90 s).
SMALL = dict(new=(8, 128, 1024), prefix=(0, 512), prefill_batch=(1, 3), decode_batch=(1, 12),
             context=(64, 2048), max_step_tokens=4096)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    from radixkv.offline.calibration.measure import Grid
    path = tmp_path_factory.mktemp("cal") / "p.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Grid, "for_device", classmethod(lambda cls, device: cls(**SMALL)))
        assert main(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--repeats", "1",
                     "--passes", "2", "--out", str(path)]) == 0
    return path


def test_cpu_grid_reaches_the_shapes_cpu_workloads_do():
    """Prefills up to the default 8192-token chunk after prefixes up to 4096, decode batches
    up to 64 at contexts up to 6144 (past the cache-spill size), each step within its caps."""
    import torch

    from radixkv.offline.calibration.measure import Grid, pool_slots
    g = Grid.for_device(torch.device("cpu"))
    pts = g.points()
    prefills = [segs for segs, ctxs in pts if segs]
    decodes = [ctxs for segs, ctxs in pts if ctxs]
    assert all(not (segs and ctxs) for segs, ctxs in pts)
    assert ((4096, 4096),) in prefills and ((4096, 2048),) * 3 in prefills
    assert ((0, 8),) * 3 in prefills and max(sum(n for _, n in s) for s in prefills) == 6144
    assert all(sum(n for _, n in s) <= g.max_step_tokens == 8192 for s in prefills)
    mixed = [s for s in prefills if len({n for _, n in s}) > 1]
    assert len(mixed) == (len(prefills) - len(mixed)) // 3 and all(s[0][1] <= 2048 for s in mixed)
    assert (6144,) * 32 in decodes and (2048,) * 64 in decodes and (4096,) * 64 not in decodes
    assert max(map(len, decodes)) == 64 and all(sum(c) <= 200_000 for c in decodes)
    assert {len(c) for c in decodes} == {1, 2, 4, 12, 32, 64}
    assert {c[0] for c in decodes if len(c) == 4 and len(set(c)) == 1} == \
        {64, 256, 768, 1280, 2048, 4096, 6144}
    assert len(pts) == len(Grid().points()) and pool_slots(pts) == 32 * 6145
    assert g.as_dict()["repeat_budget_s"] == 0.5


def test_calibrate_writes_a_profile(profile):
    doc = json.loads(profile.read_text())
    assert doc["model"]["name"] == "tiny-llama" and doc["device"] == "cpu"
    assert doc["dtype"] == "float32" and doc["backend"] == "sdpa"
    assert doc["machine"]["threads"] == 1 and doc["grid"]["repeats"] == 1
    assert doc["grid"]["passes"] == 2 and all(
        len(x["passes"]) == 2 and x["seconds"] == pytest.approx(sum(x["passes"]) / 2)
        for x in doc["samples"])
    assert doc["format"] == "radixkv-profile/3" and "spilled_kv_bytes" in doc["coefficients"]
    held = doc["correction"]["held_out"]
    assert doc["correction"]["kind"] == "grid-ratio" and held["samples"] > 0
    assert held["rms"] <= held["max_abs"] and doc["machine"]["affinity"]
    assert doc["spill_bytes"] is None or doc["spill_bytes"] > 0
    assert doc["residuals"]["samples"] + doc["residuals"]["outliers"] == len(doc["samples"])
    assert min(doc["coefficients"].values()) >= 0 and doc["coefficients"]["step"] > 0


def test_validate_reports_each_metric(profile, tmp_path):
    out = tmp_path / "v.json"
    assert main(["validate", "--model", "tiny-llama", "--profile", str(profile), "support",
                 "--users", "3", "--turns", "2", "--seed", "5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["metrics"]) >= {"ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90", "makespan_s"}
    for m in doc["metrics"].values():
        assert m["real"] > 0 and m["simulated"] > 0
        assert m["relative_error"] == pytest.approx(m["simulated"] / m["real"] - 1)
    assert doc["units"] == {"real": "s", "simulated": "s", "relative_error": "fraction"}
    # the simulator with the profile: same command shape as any simulate run
    assert main(["simulate", "--profile", str(profile), "--users", "3", "--turns", "2",
                 "--vocab-size", "259"]) == 0


def test_validate_compares_the_median_of_the_timed_real_runs(profile, tmp_path):
    """--real-runs 3: three timed runs after an untimed one; each real figure is their median
    and its spread (largest - smallest) / median; the simulation is run once."""
    import numpy as np
    out = tmp_path / "v.json"
    assert main(["validate", "--model", "tiny-llama", "--profile", str(profile), "support",
                 "--users", "3", "--turns", "2", "--seed", "5", "--real-runs", "3",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    runs = doc["real_runs"]
    assert len(runs) == 3 and set(doc["cold_run"]) == set(runs[0]) == set(doc["metrics"])
    for k, m in doc["metrics"].items():
        vals = [r[k] for r in runs]
        assert m["real"] == float(np.median(vals))
        assert doc["real_spread"][k] == pytest.approx((max(vals) - min(vals)) / m["real"])


def test_real_runs_median_and_spread_exactly():
    from radixkv.offline.calibration.fidelity import EXTRA, METRICS, RealRuns, compare
    keys = METRICS + EXTRA
    runs = tuple({k: v * (i + 1) for i, k in enumerate(keys)} for v in (1.0, 4.0, 2.0, 3.0))
    rr = RealRuns(runs, cold={k: 9.0 for k in keys}, requests=7)
    med = rr.median()
    assert med == {k: 2.5 * (i + 1) for i, k in enumerate(keys)}     # even count: the middle two
    assert rr.spread() == {k: pytest.approx(3 / 2.5) for k in keys}
    zero = RealRuns(({k: 0.0 for k in keys},) * 2, cold={}, requests=1)
    assert zero.spread() == {k: 0.0 for k in keys}
    fid = compare(med, {k: 2.75 * (i + 1) for i, k in enumerate(keys)})
    assert [r.metric for r in fid.rows] == list(keys)
    assert all(r.relative_error == pytest.approx(0.1) for r in fid.rows)


def test_validate_speed_check_reports_the_drift_and_a_run_at_that_speed(profile, tmp_path):
    out = tmp_path / "v.json"
    assert main(["validate", "--model", "tiny-llama", "--profile", str(profile), "support",
                 "--users", "3", "--turns", "2", "--speed-check", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    sp = doc["speed"]
    assert sp["before"] > 0 and sp["after"] > 0
    assert sp["simulated_at"] == pytest.approx((sp["before"] * sp["after"]) ** 0.5)
    assert set(doc["metrics_at_speed"]) == set(doc["metrics"])
    for k, m in doc["metrics_at_speed"].items():
        assert m["real"] == doc["metrics"][k]["real"]       # the same real runs, two simulations
        assert m["relative_error"] == pytest.approx(m["simulated"] / m["real"] - 1)


@pytest.mark.parametrize("argv, needle", [
    (["validate", "--profile", "{tmp}/missing.json", "support"], "missing.json' does not exist"),
    (["validate", "--model", "tiny-llama-4l", "--profile", "{profile}", "support"],
     "measured on model 'tiny-llama', not 'tiny-llama-4l'"),
    (["simulate", "--profile", "{profile}", "--gpu", "h200"], "--gpu h200 does not apply"),
    (["simulate", "--profile", "{bad}"], "is not valid JSON"),
    (["simulate", "--tp", "3"], "tp 3 does not divide"),
    (["calibrate", "--model", "nope", "--out", "{tmp}/x.json"], "unknown model 'nope'"),
    (["calibrate", "--passes", "0", "--out", "{tmp}/x.json"], "--passes must be a positive int, got 0"),
    (["validate", "--profile", "{profile}", "--real-runs", "0", "support"],
     "--real-runs must be a positive int, got 0"),
])
def test_one_line_errors(profile, tmp_path, capsys, argv, needle):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    argv = [a.format(tmp=tmp_path, profile=profile, bad=bad) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"radixkv {argv[0]}: error:") and needle in err


def test_grid_max_slots_leaves_out_exactly_the_steps_that_need_more():
    from radixkv.offline.calibration.measure import Grid, pool_slots
    every = Grid(**SMALL).points()
    kept = Grid(**SMALL, max_slots=3000).points()
    assert kept == [pt for pt in every if pool_slots([pt]) <= 3000]
    assert len(kept) < len(every) and pool_slots(kept) <= 3000
    with pytest.raises(ValueError, match="calibration grid: max_slots must be an int >= 0, got -1"):
        Grid(max_slots=-1)
    with pytest.raises(ValueError, match="no point fits a KV pool of 4 slots"):
        Grid(**SMALL, max_slots=4).points()


def test_kv_room_keeps_the_weights_and_a_reserve(monkeypatch):
    import torch

    import radixkv.model.setup as setup
    t = setup.TorchTarget("llama-3-8b", setup.model_args("llama-3-8b"), torch.device("cuda"),
                          torch.bfloat16, 1)
    monkeypatch.setattr(setup, "device_memory", lambda dev: (140 * 2**30, "an H200"))
    # 140 GiB free - 14 GiB reserve - 2 x 8,030,261,248 bytes of weights, at 131,072 B/token
    assert t.weight_bytes == 2 * 8_030_261_248
    assert t.kv_room() == (126 * 2**30 - 2 * 8_030_261_248) // 131_072
    # the CUDA grid's largest decode (256 x 4,096 disjoint contexts) does not fit beside them
    from radixkv.offline.calibration.measure import Grid, pool_slots
    assert pool_slots(Grid.for_device(torch.device("cuda")).points()) > t.kv_room()


def test_calibrate_leaves_out_steps_that_do_not_fit(tmp_path, monkeypatch, capsys):
    import radixkv.model.setup as setup
    from radixkv.offline.calibration.measure import Grid, pool_slots
    monkeypatch.setattr(Grid, "for_device", classmethod(lambda cls, device: cls(**SMALL)))
    monkeypatch.setattr(setup.TorchTarget, "kv_room", lambda self, reserve=0.1: 3000)
    path = tmp_path / "p.json"
    assert main(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--repeats", "1",
                 "--out", str(path)]) == 0
    every, kept = Grid(**SMALL).points(), Grid(**SMALL, max_slots=3000).points()
    assert (f"{len(every) - len(kept)} of {len(every)} grid steps need a KV pool over the 3,000 "
            f"tokens that fit beside the weights: left out") in capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert doc["grid"]["max_slots"] == 3000 and len(doc["samples"]) == len(kept)
    assert pool_slots(kept) <= 3000


def test_validate_steps_prices_each_kind_of_real_step(profile, tmp_path):
    """--steps: the real run's steps by kind, their seconds adding up to its busy seconds."""
    from radixkv.offline.calibration.fidelity import STEP_KINDS
    out = tmp_path / "v.json"
    assert main(["validate", "--model", "tiny-llama", "--profile", str(profile), "support",
                 "--users", "3", "--turns", "2", "--seed", "5", "--steps", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    kinds = doc["steps"]
    assert [k["kind"] for k in kinds] == [k for k in STEP_KINDS if k in {x["kind"] for x in kinds}]
    assert {"prefill", "decode 1"} <= {k["kind"] for k in kinds}
    # the timed runs' steps, the untimed pass's left out
    assert sum(k["real"] for k in kinds) == pytest.approx(
        sum(r["busy_s"] for r in doc["real_runs"]))
    assert sum(k["share"] for k in kinds) == pytest.approx(1.0)
    for k in kinds:
        assert k["steps"] > 0 and k["priced"] > 0
        assert k["relative_error"] == pytest.approx(k["priced"] / k["real"] - 1)


def test_price_steps_groups_and_prices_step_by_step():
    from radixkv.offline.calibration.fidelity import StepLog, price_steps, step_kind
    from radixkv.engine.executor import BatchPlan, StepResult
    from radixkv.sched.batch import Segment
    from radixkv.sched.request import Request

    class Cost:            # a step costs 1 ms per new token
        def step_time(self, segs, ctxs):
            return 0.001 * (sum(n for _, n in segs) + len(ctxs))

    steps = [(((0, 100),), (), 0.2), ((), (50,), 0.002), ((), (50, 60, 70), 0.004),
             ((), (9,) * 20, 0.04), (((10, 5),), (30,), 0.01), ((), (51,), 0.001)]
    got = price_steps(steps, Cost())
    assert [(k.kind, k.steps) for k in got] == [
        ("prefill", 1), ("prefill + decodes", 1), ("decode 1", 2), ("decode 2-4", 1),
        ("decode 17-64", 1)]
    d1 = got[2]
    assert d1.real_s == pytest.approx(0.003) and d1.priced_s == pytest.approx(0.002)
    assert d1.relative_error == pytest.approx(-1 / 3) and d1.share == pytest.approx(0.003 / 0.257)
    assert step_kind((), (1,) * 65) == "decode 65+" and step_kind((), (1,) * 5) == "decode 5-16"

    class Inner:
        name, busy_s = "inner", 0.0

        def run(self, plan):
            return StepResult([None] * len(plan.segments), 0.5)
    log = StepLog(Inner())
    plan = BatchPlan()
    plan.decodes.append(Segment(Request("r", [1], 1), 7, [3], [0] * 8, sample=True))
    assert log.run(plan).duration == 0.5 and log.run(BatchPlan()).duration == 0.5
    assert log.steps == [((), (7,), 0.5)] and log.name == "inner"
