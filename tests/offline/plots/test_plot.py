"""compare.png and timeline.png: the per-panel scale decision, the hit-rate window, value
labels, and pictures written for 1 and 10 configurations, one without finished requests and a
zero-length makespan."""
import math

import numpy as np
import pytest

from radixkv.config import EngineConfig
from radixkv.engine.engine import Engine
from radixkv.engine.metrics import EngineReport, RequestRecord
from radixkv.offline.plots.compare import _isolated, hit_window, plot_compare, plot_timeline, typical_step
from radixkv.offline.plots.style import config_colors, format_value, use_log_scale
from radixkv.sched.request import Request
from radixkv.sim.executor import SimExecutor

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("values, log", [
    ([0.1, 10.0], False),                    # exactly two decades: linear
    ([0.1, 10.001], True),
    ([0.0862, 0.103, 0.254, 47.9], True),    # TTFT p50 of the default run
    ([6.69, 8.14, 22.4, 108.0], False),      # its TTFT p99
    ([0.0, 5.0, 1000.0], False),             # a zero cannot sit on a log axis
    ([-1.0, 500.0], False),
    ([None, 0.01, 5.0], True),               # a configuration without finished requests
    ([None, math.nan, 0.01, math.inf], False),
    ([3.0], False), ([], False), ([None, None], False),
])
def test_use_log_scale(values, log):
    assert use_log_scale(values) is log


def test_use_log_scale_threshold_is_a_parameter():
    assert use_log_scale([1.0, 20.0], decades=1.0) and not use_log_scale([1.0, 20.0])


@pytest.mark.parametrize("makespan, step, window", [
    (271.74, 0.0138, 5.0),           # the default run: makespan / 50 = 5.43, rounded down
    (207.6, 0.0, 2.0), (50.0, 0.0, 1.0), (100.0, 0.0, 2.0), (499.0, 0.0, 5.0), (500.0, 0.0, 10.0),
    (0.37, 0.0, 0.005), (1e-3, 0.0, 2e-5),
    (0.28, 0.009, 0.05),             # 4 steps = 0.036 s > 0.28 / 50: the step floor, rounded up
    (0.28, 0.0125, 0.05), (10.0, 0.05, 0.2), (10.0, 0.06, 0.5),
    (0.0, 0.01, 0.05),               # zero makespan, steps known
    (0.0, 0.0, 1.0), (-3.0, 0.0, 1.0), (math.inf, 0.0, 1.0), (math.nan, math.nan, 1.0),
])
def test_hit_window(makespan, step, window):
    assert hit_window(makespan, step) == pytest.approx(window, rel=1e-12)


def test_typical_step_is_the_largest_median_step_gap():
    a = report_with_steps([0.0, 0.1, 0.2, 0.5])       # gaps .1 .1 .3: median .1
    b = report_with_steps([1.0, 1.5, 2.0])            # gaps .5 .5
    assert typical_step([a, b]) == pytest.approx(0.5)
    assert typical_step([a]) == pytest.approx(0.1)
    assert typical_step([report_with_steps([3.0]), empty_report()]) == 0.0 == typical_step([])


def test_isolated_points_are_those_between_gaps():
    y = np.array([np.nan, 1.0, np.nan, 2.0, 3.0, np.nan, 4.0])
    np.testing.assert_array_equal(_isolated(y), [False, True, False, False, False, False, True])
    assert _isolated(np.array([5.0])).tolist() == [True]
    assert _isolated(np.array([])).tolist() == []


@pytest.mark.parametrize("v, kind, text", [
    (71.3167, "pct", "71.3%"), (0.0, "pct", "0.0%"), (971313, "tokens", "971k"),
    (3399961, "tokens", "3.40M"), (12345, "tokens", "12.3k"), (0, "tokens", "0"),
    (1462.23, "tok/s", "1,462"), (0.0862, "s", "0.0862 s"), (107.99, "s", "108 s"),
    (None, "s", "n/a"), (math.nan, "tokens", "n/a"),
])
def test_format_value(v, kind, text):
    assert format_value(v, kind) == text


def test_config_colors_are_distinct_up_to_ten_and_stable():
    assert len(set(config_colors(10))) == 10 and config_colors(6) == config_colors(10)[:6]
    assert len(config_colors(12)) == 12


def run_report(name: str, n: int, shift: int = 0) -> EngineReport:
    cfg = EngineConfig(kv_capacity=2048, name=name)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())
    for i in range(n):
        eng.add_request(Request(f"r{i}", list(range(96)) + [2000 + shift + i] * 16, 4 + i % 3,
                                arrival=0.02 * i))
    return eng.run_until_idle()


def empty_report(name: str = "nothing finished") -> EngineReport:
    return EngineReport(name, [], 0, 0, 0, 0, 0, 0.0, 2048,
                        {"t": [], "waiting": [], "running": [], "kv_used": []})


def instant_report(name: str = "zero makespan") -> EngineReport:
    r = RequestRecord("z", 0.0, 0.0, 0.0, 0.0, 0.0, 16, 1, 0, 16, 0, 0, 0.0)
    return EngineReport(name, [r], 0, 0, 0, 0, 1, 0.0, 2048,
                        {"t": [0.0], "waiting": [0], "running": [1], "kv_used": [16]})


def report_with_steps(t) -> EngineReport:
    return EngineReport("steps", [], 0, 0, 0, 0, len(t), 0.0, 2048,
                        {"t": list(t), "waiting": [0] * len(t), "running": [0] * len(t),
                         "kv_used": [0] * len(t)})


def check_png(path):
    assert path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


@pytest.fixture(scope="module")
def ten():
    names = ["1 radix fcfs lru p1", "2 radix lpm slru p1", "3 radix fcfs lru p16", "4 no cache",
             "5 blockhash16 fcfs", "6 radix fcfs belady p1",
             "7 a configuration with a name long enough to need wrapping twice over"]
    out = [(name, run_report(name, 3 + i, shift=100 * i)) for i, name in enumerate(names)]
    return out + [("8 nothing finished", empty_report()), ("9 zero makespan", instant_report()),
                  ("10 radix again", run_report("10", 12))]


@pytest.mark.parametrize("case", ["one", "ten", "empty", "instant", "none_at_all"])
def test_pictures_are_written(tmp_path, ten, case):
    results = {"one": ten[:1], "ten": ten, "empty": [("nothing finished", empty_report())],
               "instant": [("zero makespan", instant_report())], "none_at_all": []}[case]
    c = plot_compare(results, tmp_path / "sub" / "compare.png", title=case)
    t = plot_timeline(results, tmp_path / "sub" / "timeline.png", title=case)
    assert c == tmp_path / "sub" / "compare.png" and t == tmp_path / "sub" / "timeline.png"
    check_png(c)
    check_png(t)


def test_pictures_accept_str_paths_and_no_title(tmp_path, ten):
    assert plot_compare(ten[:2], str(tmp_path / "c.png")).read_bytes()[:8] == PNG
    assert plot_timeline(ten[:2], str(tmp_path / "t.png")).read_bytes()[:8] == PNG


def test_plotting_leaves_no_figure_open(tmp_path, ten):
    import matplotlib.pyplot as plt
    before = len(plt.get_fignums())
    plot_compare(ten[:3], tmp_path / "c.png")
    plot_timeline(ten[:3], tmp_path / "t.png")
    assert len(plt.get_fignums()) == before
