"""A TTFT predictor fitted online from the TTFTs a front end observes: the measured time to first
token of each request, regressed on what the router knew when it routed it.

The features of a request on a replica (router/radixkv.py computes them):

  wait      seconds of prefill queued ahead of it (the step cost's price of the pending tokens)
  own       seconds of its own prefill after its held prefix (the step cost's price)
  new       thousands of those prompt tokens (a host's cost per token: tokenizing, hashing,
            inserting, which the step cost does not price)
  ahead     requests routed there whose first token has not come back
  running   requests there past their first token (each one's decode shares every step)
  overflow  thousands of KV tokens by which the requests in flight there, plus this one, exceed
            the replica's KV capacity (they wait for running ones to finish)
  1         a fixed overhead (the front end, the network, the tokenizer)

The prediction is theta . x with theta >= 0, the ridge-regularised non-negative least squares over
the last `window` observations, pulled toward the prior (wait and own priced as the step cost
says, each running request at what it adds to a step, a price per thousand overflowing tokens,
nothing per token, ahead or fixed) with the weight of `prior`
observations per feature, so that a feature the data never varies keeps its prior. Non-negative
least squares over seven features is solved exactly on its normal equations by Lawson and
Hanson's active-set method. Every observation is also scored against the
prediction made when its request was routed, before the fit saw it (prequential error), which is
how well the prediction tracks the measured TTFT.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from radixkv.argcheck import finite_at_least, positive_int

FEATURES = ("wait", "own", "new", "ahead", "running", "overflow", "overhead")


class FitQuality(NamedTuple):
    observations: int
    median_abs_error: float        # median |predicted / measured - 1|, each predicted at routing
    p90_abs_error: float
    coefficients: dict[str, float]


class TTFTFit:
    def __init__(self, running_prior: float, overflow_prior: float, *, window: int = 512,
                 prior: float = 4.0, refit_every: int = 8):
        finite_at_least(running_prior, "TTFTFit running_prior", 0)
        finite_at_least(overflow_prior, "TTFTFit overflow_prior", 0)
        positive_int(window, "TTFTFit window")
        finite_at_least(prior, "TTFTFit prior", 0)
        positive_int(refit_every, "TTFTFit refit_every")
        self.theta0 = np.array([1.0, 1.0, 0.0, 0.0, running_prior, overflow_prior, 0.0])
        self.theta = self.theta0.copy()
        self.prior, self.refit_every, self.window = prior, refit_every, window
        # the observations, oldest first, in rows [end - window, end) of twice the window: a
        # full buffer moves its last window - 1 rows to the front, once per window observed
        self._X = np.empty((2 * window, len(FEATURES)))
        self._y = np.empty(2 * window)
        self._end = 0
        self.errors: deque[float] = deque(maxlen=window)
        self.seen = 0

    def predict(self, x: np.ndarray) -> float:
        return float(self.theta @ x)

    def observe(self, x: np.ndarray, measured: float, predicted: float) -> None:
        """`measured` seconds to the first token of a request routed with features `x`, for
        which `predicted` was said at routing."""
        finite_at_least(measured, "measured TTFT", 0)
        X, y, end = self._X, self._y, self._end
        if end == len(y):
            keep = self.window - 1
            X[:keep], y[:keep] = X[end - keep:end], y[end - keep:end]
            end = keep
        X[end], y[end] = x, measured
        self._end = end + 1
        if measured > 0:
            self.errors.append(abs(predicted / measured - 1.0))
        self.seen += 1
        if self.seen % self.refit_every == 0:
            self.refit()

    def _window(self) -> tuple[np.ndarray, np.ndarray]:
        lo = max(0, self._end - self.window)
        return self._X[lo:self._end], self._y[lo:self._end]

    def observations(self) -> tuple[np.ndarray, np.ndarray]:
        """The window the fit regresses on, oldest first: features (rows) and measured TTFTs."""
        X, y = self._window()
        return X.copy(), y.copy()

    def refit(self) -> None:
        if not self._end:
            return
        X, y = self._window()                     # rows: observations, oldest first
        # the prior as pseudo-observations: feature j pulled to theta0[j] with the weight of
        # `prior` typical observations of it
        scale = np.sqrt(self.prior * np.maximum((X ** 2).mean(axis=0), 1e-12))
        # the system [X; diag(scale)] theta ~ [y; scale * theta0] through its normal equations
        # (7 x 7), by Lawson and Hanson's active set: this runs on the gateway's event loop
        self.theta = _nnls(X.T @ X + np.diag(scale ** 2), X.T @ y + scale ** 2 * self.theta0)

    def quality(self) -> FitQuality:
        e = np.fromiter(self.errors, float, len(self.errors))
        med, p90 = (float(np.median(e)), float(np.quantile(e, 0.9))) if len(e) else (0.0, 0.0)
        return FitQuality(self.seen, med, p90,
                          {f: round(float(t), 6) for f, t in zip(FEATURES, self.theta)})


def _solve(G: np.ndarray, c: np.ndarray, cols: list[int]) -> np.ndarray:
    try:
        return np.linalg.solve(G[np.ix_(cols, cols)], c[cols])
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(G[np.ix_(cols, cols)], c[cols], rcond=None)[0]


def _nnls(G: np.ndarray, c: np.ndarray) -> np.ndarray:
    """argmin over theta >= 0 of theta' G theta - 2 c' theta (G positive definite): Lawson and
    Hanson's active set on the normal equations."""
    g = np.diag(G)                            # unit diagonal: one tolerance fits every feature
    d = np.where(g > 0, 1.0 / np.sqrt(np.where(g > 0, g, 1.0)), 1.0)
    G, c, k = G * np.outer(d, d), c * d, len(c)
    theta, free = np.zeros(k), []
    tol = 1e-12 * max(1.0, float(np.abs(c).max()))
    for _ in range(3 * k):
        grad = c - G @ theta                   # the descent direction of each bound coefficient
        bound = [j for j in range(k) if j not in free]
        if not bound or max(grad[j] for j in bound) <= tol:
            break
        free.append(max(bound, key=lambda j: grad[j]))
        while True:
            s = np.zeros(k)
            s[free] = _solve(G, c, free)
            if (s[free] > 0).all():
                theta = s
                break
            # step toward s until a coefficient reaches 0; it leaves the free set
            alpha = min(theta[j] / (theta[j] - s[j]) for j in free if s[j] <= 0)
            theta = theta + alpha * (s - theta)
            free = [j for j in free if theta[j] > tol]
            theta[[j for j in range(k) if j not in free]] = 0.0
    return theta * d
