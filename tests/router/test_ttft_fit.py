"""The online TTFT fit (router/ttft_fit.py) and the radixkv router's fitted mode: the fit is the
exact regularised non-negative least squares (checked by its optimality conditions), recovers a
known law, keeps its prior where the data do not vary, scores each prediction made at routing;
the router feeds it the features it routed on and spreads a new prefix by load."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from radixkv.router import ReplicaView, RequestInfo, RouterContext, make_router
from radixkv.offline.simulate import build_requests
from radixkv.offline.cluster.simulator import Cluster, run_cluster
from radixkv.router.radixkv import RadixKVOptions
from radixkv.router.ttft_fit import FEATURES, TTFTFit
from radixkv.sim.costmodel import CostModel
from tests.offline.cluster.test_cluster import CFG, WL
from tests.router.test_routers import stored

K = len(FEATURES)
COST = CostModel.named("llama-3-8b", "h100-sxm")


def system(fit: TTFTFit) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares system the fit solves, rebuilt from its window (the prior as rows)."""
    X, y = fit.observations()
    scale = np.sqrt(fit.prior * np.maximum((X ** 2).mean(axis=0), 1e-12))
    return np.vstack([X, np.diag(scale)]), np.concatenate([y, scale * fit.theta0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0, 5), min_size=K, max_size=K),
                          st.floats(0, 10)), min_size=1, max_size=40))
def test_the_fit_is_the_nonnegative_least_squares_optimum(rows):
    fit = TTFTFit(0.1, 0.5, refit_every=1)
    for x, y in rows:
        fit.observe(np.array(x), y, 1.0)
    A, b = system(fit)
    theta = fit.theta
    grad = A.T @ (A @ theta - b)
    tol = 1e-6 * max(1.0, float(np.abs(A).max()) ** 2 * (1 + float(np.abs(b).max())))
    assert (theta >= 0).all()
    # KKT: zero gradient where positive, non-negative where at the bound
    assert np.all(np.abs(grad[theta > 0]) <= tol * 10)
    assert np.all(grad[theta == 0] >= -tol * 10)


def test_the_fit_recovers_a_known_law_and_scores_each_prediction_made_at_routing():
    rng = np.random.default_rng(0)
    truth = np.array([2.0, 1.5, 0.3, 0.01, 0.004, 0.0, 0.02])
    fit = TTFTFit(0.0, 0.0, window=256, prior=0.0)     # no pull: the data alone
    for _ in range(256):
        x = np.concatenate([rng.uniform(0, 0.2, 2), rng.uniform(0, 4, 1), rng.integers(0, 8, 2),
                            [0.0, 1.0]])
        fit.observe(x, float(truth @ x), fit.predict(x))
    np.testing.assert_allclose(fit.theta[[0, 1, 2, 3, 4, 6]], truth[[0, 1, 2, 3, 4, 6]],
                               rtol=1e-6, atol=1e-9)
    assert fit.theta[5] == fit.theta0[5] == 0.0     # overflow never varied: its prior, 0
    q = fit.quality()
    assert q.observations == 256 and set(q.coefficients) == set(FEATURES)
    # scored against what was said before each was seen: early ones (the prior) were wrong
    assert q.p90_abs_error > q.median_abs_error >= 0
    late = list(fit.errors)[-64:]
    assert max(late) < 0.1


def test_a_feature_the_data_never_vary_keeps_its_prior_and_errors_are_exact():
    fit = TTFTFit(0.25, 0.75, refit_every=1)
    for i in range(20):           # only `own` varies: overflow is always 0
        fit.observe(np.array([0, 0.01 * i, 0, 0, 0, 0, 0.0]), 0.03 * i, 0.0 if i else 1.0)
    assert fit.theta[5] == pytest.approx(0.75) and fit.theta[4] == pytest.approx(0.25)
    assert fit.theta[1] > 2.5                   # the data: 3 s per second of own
    fit2 = TTFTFit(0.0, 0.0)
    fit2.observe(np.ones(K), 1.0, 2.0)
    fit2.observe(np.ones(K), 4.0, 3.0)
    assert list(fit2.errors) == [1.0, 0.25]
    assert fit2.quality().median_abs_error == 0.625


@pytest.mark.parametrize("args, message", [
    ((-1.0, 0.0), "running_prior"), ((0.0, float("nan")), "overflow_prior"),
])
def test_bad_fit_settings_and_measurements_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        TTFTFit(*args)
    fit = TTFTFit(0.0, 0.0)
    with pytest.raises(ValueError, match="measured TTFT"):
        fit.observe(np.ones(K), -0.5, 0.0)
    assert fit.seen == 0 and not len(fit.observations()[1])
    with pytest.raises(ValueError, match="fit_tie"):
        RadixKVOptions(fit=True, fit_tie=-0.1)
    with pytest.raises(ValueError, match="fit must be True or False"):
        RadixKVOptions(fit=1)
    with pytest.raises(ValueError, match="router 'radixkv-fit' fits its TTFT"):
        make_router("radixkv-fit", RouterContext(2, cost=COST), RadixKVOptions(fit=False))
    assert make_router("radixkv-fit", RouterContext(2, cost=COST)).fit is not None


def test_the_router_fits_on_the_features_it_routed_on_and_ignores_late_reports():
    r = make_router("radixkv", RouterContext(2, page_size=4, cost=COST), RadixKVOptions(fit=True))
    views = [ReplicaView(kv_capacity=3000)] * 2
    a = RequestInfo("a", list(range(2000)), max_new_tokens=100)
    i = r.route(a, views)
    x_said = r._last[1][i][0]
    r.on_route(i, a)
    assert r.flying[i] == r.ahead[i] == 1 and r.budget[i] == 100
    b = RequestInfo("b", list(range(2000)) + [7, 8, 9, 10], max_new_tokens=1500)
    x = r.features(i, b, r.predict(b, r.page_hashes(b))[i], views[i])
    # b on a's replica: a ahead, 2,000 of b's tokens held there; overflow: a's 2,000 prompt
    # tokens + 100 budget + b's 4 new + 1,500 budget = 3,604 against 3,000
    assert x[FEATURES.index("ahead")] == 1 and x[FEATURES.index("running")] == 0
    assert x[FEATURES.index("new")] == pytest.approx(0.004)
    assert x[FEATURES.index("overflow")] == pytest.approx(0.604)
    r.on_ttft(i, a, 0.25)
    X, y = r.fit.observations()
    assert r.fit.seen == 1 and np.array_equal(X, [x_said]) and y.tolist() == [0.25]
    r.on_first_token(i, a)
    r.on_ttft(i, a, 9.0)                      # reported twice: counted once
    assert r.fit.seen == 1 and r.ahead[i] == 0 and r.flying[i] == 1
    r.on_finish(i, a)
    assert r.flying == [0, 0] and r.budget == [0, 0] and r.inflight[i].count == {}


def test_a_new_prefix_spreads_by_load_with_the_fit_and_follows_a_held_one():
    """A prompt sharing one page with what a busy replica holds: the step-cost rule takes the
    page (and the busy replica); the fitted rule calls the difference a tie and takes the idle
    replica. A prompt whose long prefix is held goes to its holder either way."""
    prefix = list(range(4000))
    other = [0, 1, 2, 3] + list(range(10_000, 14_000))
    views = [ReplicaView(running=6, kv_capacity=100_000), ReplicaView(kv_capacity=100_000)]
    for fit, expect in ((False, 0), (True, 1)):
        r = make_router("radixkv", RouterContext(2, page_size=4, cost=COST),
                        RadixKVOptions(fit=fit))
        r.on_events(0, stored(prefix))
        for j in range(6):                    # six running on replica 0
            q = RequestInfo(f"run{j}", prefix + [j])
            r.on_route(0, q)
            r.on_first_token(0, q)
        assert r.route(RequestInfo("new", other), views) == expect
        assert r.route(RequestInfo("held", prefix + [99]), views) == 0


def test_in_the_cluster_simulator_every_ttft_reaches_the_fit_and_it_tracks_them():
    r = make_router("radixkv", CFG.context(COST), RadixKVOptions(fit=True))
    cluster = Cluster(CFG, r, COST)
    reqs = build_requests(WL)
    cluster.run([(q, None) for q in reqs])
    cluster.check()
    q = r.fit.quality()
    assert q.observations == len(reqs)
    assert q.median_abs_error < 0.5
    assert r.flying == r.ahead == r.budget == [0] * CFG.replicas
    # the same run twice: the same routes (the fit is deterministic)
    assert run_cluster(WL, CFG, "radixkv", COST, RadixKVOptions(fit=True)) == \
        run_cluster(WL, CFG, "radixkv", COST, RadixKVOptions(fit=True))


@pytest.mark.parametrize("window", [1, 3, 8])
def test_the_window_holds_the_latest_observations_oldest_first_across_wraps(window):
    fit = TTFTFit(0.0, 0.0, window=window, refit_every=1000)
    for k in range(5 * window + 2):
        fit.observe(np.full(7, float(k)), float(k), 1.0)
        X, y = fit.observations()
        want = list(range(max(0, k + 1 - window), k + 1))
        assert y.tolist() == want and X[:, 0].tolist() == want and X.shape == (len(want), 7)
