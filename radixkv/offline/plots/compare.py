"""compare.png (key figures per configuration as named bars, and TTFT CDFs) and timeline.png
(windowed hit rate, waiting queue and KV usage over simulated time, per configuration)."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np

from radixkv.engine.metrics import EngineReport
from radixkv.offline.plots.style import bar_panel, config_colors, plain_log_ticks, pyplot, save

# (summary key, panel title, kind); kind picks the axis and the value format
_RATE_PANELS = [("hit_rate", "prefix-cache hit rate", "pct"),
                ("prefill_tokens", "prefill tokens computed", "tokens"),
                ("evicted_tokens", "evicted tokens", "tokens"),
                ("throughput_tok_s", "output throughput", "tok/s")]
_LATENCY_PANELS = [("ttft_p50", "TTFT p50", "s"), ("ttft_p99", "TTFT p99", "s"),
                   ("e2e_p50", "E2E p50", "s"), ("e2e_p99", "E2E p99", "s")]
_NAME_WIDTH = 22          # characters per line of a configuration name beside its bar


def hit_window(makespan: float, step: float = 0.0, points: int = 50) -> float:
    """The sliding window (s) of the timeline's hit rate: makespan / points rounded down to
    1, 2 or 5 times a power of ten, but never under 4 typical step intervals (rounded up),
    since a request is admitted one step before any step time that can count it; 1 s when
    neither gives a positive, finite length."""
    raw = makespan / points if math.isfinite(makespan) and makespan > 0 else 0.0
    floor = 4 * step if math.isfinite(step) and step > 0 else 0.0
    if raw <= 0 and floor <= 0:
        return 1.0
    window = _nice(raw, up=False) if raw > 0 else 0.0
    return window if window >= floor else _nice(floor, up=True)


def _nice(x: float, up: bool) -> float:
    exp = math.floor(math.log10(x))
    mant = x / 10 ** exp
    steps = (1, 2, 5, 10)
    m = (min(v for v in steps if v >= mant * (1 - 1e-9)) if up
         else max(v for v in steps if v <= mant * (1 + 1e-9)))
    return float(m * 10.0 ** exp)


def typical_step(reports: Sequence[EngineReport]) -> float:
    """The largest median gap between consecutive engine steps among the reports (0 if none)."""
    gaps = [float(np.median(np.diff(t))) for t in
            (np.asarray(rep.timeline.get("t", []), dtype=float) for rep in reports) if len(t) > 1]
    return max(gaps, default=0.0)


def _names(results: Sequence[tuple[str, EngineReport]]) -> list[str]:
    return [textwrap.fill(str(name), _NAME_WIDTH) for name, _ in results]


def plot_compare(results: Sequence[tuple[str, EngineReport]], path: str | Path,
                 title: str = "") -> Path:
    """compare.png: eight bar panels (hit rate, prefill and evicted tokens, throughput, TTFT and
    E2E p50/p99), each configuration named beside its bars, and the TTFT CDFs."""
    plt = pyplot()
    n = len(results)
    summaries = [rep.summary() for _, rep in results]
    colors = config_colors(n)
    names = _names(results)
    lines = max(name.count("\n") + 1 for name in names) if names else 1
    row_h = max(1.9, 0.26 * n * max(1, 0.6 * lines) + 1.1)
    fig = plt.figure(figsize=(17, 2 * row_h + 5.2), layout="constrained")
    try:
        _draw_compare(fig, summaries, results, names, colors, row_h, title)
        return save(fig, path)
    finally:
        plt.close(fig)


def _draw_compare(fig, summaries: list[dict], results: Sequence[tuple[str, EngineReport]],
                  names: list[str], colors: list, row_h: float, title: str) -> None:
    n = len(results)
    grid = fig.add_gridspec(3, 4, height_ratios=[row_h, row_h, 5.0])
    for row, panels in enumerate((_RATE_PANELS, _LATENCY_PANELS)):
        first = None
        for col, (key, label, kind) in enumerate(panels):
            ax = fig.add_subplot(grid[row, col], sharey=first)
            values = [s[key] for s in summaries]
            if kind == "pct":
                values = [None if v is None else 100.0 * v for v in values]
            bar_panel(ax, values, kind, colors, label)
            if first is None:
                first = ax
                ax.set_yticks(range(n), names, fontsize=8.5)
                for tick, c in zip(ax.get_yticklabels(), colors):
                    tick.set_color("0.1")
                    tick.set_bbox({"facecolor": c, "alpha": 0.18, "edgecolor": "none", "pad": 1.5})
            else:
                ax.tick_params(axis="y", labelleft=False, length=0)

    _ttft_cdf(fig.add_subplot(grid[2, :]), results, colors)
    if title:
        fig.suptitle(title, fontsize=12)


def _ttft_cdf(ax, results: Sequence[tuple[str, EngineReport]], colors: list) -> None:
    drawn, lo, hi = False, math.inf, 0.0
    for (name, rep), c in zip(results, colors):
        xs = np.sort(np.array([r.ttft for r in rep.records], dtype=float))
        xs = xs[np.isfinite(xs) & (xs > 0)]
        if not len(xs):
            ax.plot([], [], color=c, lw=2, label=f"{name} (no finished requests)")
            continue
        share = 100.0 * np.arange(1, len(xs) + 1) / len(xs)
        ax.step(np.concatenate([[xs[0]], xs]), np.concatenate([[0.0], share]), where="post",
                color=c, lw=1.8, label=name)
        drawn, lo, hi = True, min(lo, xs[0]), max(hi, xs[-1])
    if drawn:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis, lo, hi)
        ax.set_xlabel("time to first token (s, log scale)")
    else:
        ax.set_xlabel("time to first token (s)")
        ax.set_xlim(0, 1)
        ax.text(0.5, 0.5, "no finished requests", transform=ax.transAxes, ha="center",
                va="center", color="0.4")
    for q in (50, 99):
        ax.axhline(q, color="0.5", lw=0.8, ls=":")
        ax.annotate(f"p{q}", (0, q), xycoords=("axes fraction", "data"), xytext=(3, -2),
                    textcoords="offset points", fontsize=8, color="0.4", va="top")
    ax.set_ylim(0, 101)
    ax.set_ylabel("requests with TTFT ≤ x (%)")
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3, which="both")
    if results:
        # beside the panel: curves of slow and fast configurations fill either lower corner
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9, borderaxespad=0)


def _isolated(y: np.ndarray) -> np.ndarray:
    """Finite values whose neighbours on both sides are NaN (or absent)."""
    ok = np.isfinite(y)
    before = np.concatenate([[False], ok[:-1]]) if len(y) else ok
    after = np.concatenate([ok[1:], [False]]) if len(y) else ok
    return ok & ~before & ~after


def plot_timeline(results: Sequence[tuple[str, EngineReport]], path: str | Path,
                  title: str = "") -> Path:
    """timeline.png: per configuration over simulated time, the hit rate of the requests first
    admitted in a sliding window, the waiting queue length and the KV usage (% of capacity)."""
    plt = pyplot()
    window = hit_window(max((rep.makespan for _, rep in results), default=0.0),
                        typical_step([rep for _, rep in results]))
    series = [rep.timeline_series(window) for _, rep in results]
    fig = plt.figure(figsize=(15, 10.5), layout="constrained")
    try:
        _draw_timeline(fig, results, series, window, title)
        return save(fig, path)
    finally:
        plt.close(fig)


def _draw_timeline(fig, results: Sequence[tuple[str, EngineReport]], series: list[dict],
                   window: float, title: str) -> None:
    from matplotlib.ticker import MaxNLocator
    n = len(results)
    colors = config_colors(n)
    ax_hit, ax_wait, ax_kv = fig.subplots(3, 1, sharex=True)
    for (name, rep), s, c in zip(results, series, colors):
        t = s["t"]
        marker = "o" if 0 < len(t) <= 2 else None
        label = name if len(t) else f"{name} (no engine steps)"
        hit = 100.0 * s["hit_rate"]
        ax_hit.plot(t, hit, color=c, lw=1.3, marker=marker, label=label)
        # a value between two empty windows draws no line segment: mark it
        alone = _isolated(hit)
        ax_hit.plot(t[alone], hit[alone], ls="none", marker="o", ms=2.5, color=c)
        ax_wait.step(t, s["waiting"], where="post", color=c, lw=1.2, marker=marker)
        ax_kv.step(t, 100.0 * s["kv_usage"], where="post", color=c, lw=0.9, marker=marker)
    ax_hit.set_ylabel(f"hit rate (%)\nrequests first admitted\nin the last {window:g} s")
    ax_hit.set_ylim(-1.5, 101.5)
    ax_wait.set_ylabel("waiting requests\n(queue length)")
    top = max((float(s["waiting"].max()) for s in series if len(s["waiting"])), default=0.0)
    ax_wait.set_ylim(0, max(1.05 * top, 1.0))
    ax_wait.yaxis.set_major_locator(MaxNLocator(integer=True))
    caps = {rep.kv_capacity for _, rep in results}
    cap = f"{caps.pop():,} tokens" if len(caps) == 1 else "each configuration's capacity"
    ax_kv.set_ylabel(f"KV slots in use (%)\nof {cap},\ncached prefixes included")
    ax_kv.set_ylim(-1.5, 105)
    ax_kv.set_xlabel("simulated time (s)")
    ts = [float(x) for s in series if len(s["t"]) for x in (s["t"][0], s["t"][-1])]
    starts = [min(r.arrival for r in rep.records) for _, rep in results if rep.records] + ts
    if ts and max(ts) > min(starts):
        ax_kv.set_xlim(min(starts), max(ts))
    else:
        if not ts:
            ax_kv.set_xlim(0, 1)
        for ax in (ax_hit, ax_wait, ax_kv):
            ax.text(0.5, 0.5, "no simulated time elapsed" if ts else "no engine steps",
                    transform=ax.transAxes, ha="center", va="center", color="0.4")
    for ax in (ax_hit, ax_wait, ax_kv):
        ax.grid(alpha=0.3)
    if results:
        fig.legend(loc="outside right upper", fontsize=9, title="configuration")
    if title:
        fig.suptitle(title, fontsize=12)
