"""What every picture shares: one colour per configuration, value formats, the bar panel and
plain-number log ticks, and a headless matplotlib."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

_UNIT_LABEL = {"pct": "% of prompt tokens", "tokens": "tokens", "tok/s": "output tokens / s",
               "s": "seconds"}

def use_log_scale(values: Sequence[float | None], decades: float = 2.0) -> bool:
    """Whether a panel of these values needs a log axis: only when every value present is
    positive and the largest is more than 10**decades times the smallest. None and non-finite
    values (configurations without finished requests) are ignored."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(xs) < 2 or min(xs) <= 0:
        return False
    return max(xs) / min(xs) > 10 ** decades


def config_colors(n: int) -> list:
    """One colour per configuration, by position; the same list in every panel and picture."""
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def format_value(v: float | None, kind: str) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    if kind == "pct":
        return f"{v:.1f}%"
    if kind == "tokens":
        if abs(v) >= 1e6:
            return f"{v / 1e6:.2f}M"
        if abs(v) >= 1e3:
            return f"{v / 1e3:.0f}k" if abs(v) >= 1e5 else f"{v / 1e3:.1f}k"
        return f"{v:.0f}"
    if kind == "tok/s":
        return f"{v:,.0f}"
    return f"{v:.3g} s"


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def bar_panel(ax, values: list[float | None], kind: str, colors: list, title: str) -> None:
    """Horizontal bars, one per configuration (top to bottom in run order), each with its value
    at its end; the axis scale is chosen from the values and named in the axis label."""
    from matplotlib.ticker import EngFormatter, MaxNLocator
    n = len(values)
    present = [v for v in values if v is not None and math.isfinite(v)]
    log = kind == "s" and use_log_scale(values)
    if kind == "pct":
        lo, hi = 0.0, 100.0
    elif log:
        # a power of ten at least a factor 2 under the smallest bar, which then stays visible
        lo = 10.0 ** math.floor(math.log10(min(present) / 2))
        top = math.log10(max(present))
        # room on the right for the value labels, in decades
        hi = 10.0 ** (top + 0.35 * (top - math.log10(lo)) + 0.1)
    else:
        top = max(present, default=0.0)
        lo, hi = 0.0, (top * 1.32 if top > 0 else 1.0)
    ys = np.arange(n)
    bars = [v if (v is not None and math.isfinite(v)) else 0.0 for v in values]
    if log:
        ax.set_xscale("log")
        bars = [max(v, lo) for v in bars]
    ax.barh(ys, [b - lo if log else b for b in bars], left=lo if log else 0.0, color=colors,
            height=0.72)
    ax.set_xlim(lo, hi)
    if log:
        plain_log_ticks(ax.xaxis, lo, hi)
    ax.set_ylim(max(n, 1) - 0.5, -0.5)
    for y, v, c in zip(ys, values, colors):
        text = format_value(v, kind)
        if v is None or not math.isfinite(v):
            ax.annotate(text, (lo, y), xytext=(3, 0), textcoords="offset points", va="center",
                        ha="left", fontsize=8, color="0.35", style="italic")
            continue
        # a value near the end of a fixed 0-100 axis is written inside its bar
        inside = kind == "pct" and v > 80
        ax.annotate(text, (v, y), xytext=(-3 if inside else 3, 0), textcoords="offset points",
                    va="center", ha="right" if inside else "left", fontsize=8,
                    color=_text_on(c) if inside else "0.1", fontweight="bold" if inside else None)
    scale = "log scale" if log else ("linear, 0–100" if kind == "pct" else "linear")
    ax.set_xlabel(f"{_UNIT_LABEL[kind]} ({scale})", fontsize=8.5)
    ax.set_title(title, fontsize=10)
    if kind in ("tokens", "tok/s"):
        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3, which="major")
    ax.set_axisbelow(True)


def plain_log_ticks(axis, lo: float, hi: float) -> None:
    """Log-axis ticks written as plain numbers (0.01, 0.1, 1, 10); over less than ~1.5 decades
    the 2x and 5x ticks are labelled too, or a short axis would carry one label or none."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    plain = FuncFormatter(lambda x, _: f"{x:g}")
    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(plain)
    if hi > 0 and lo > 0 and math.log10(hi / lo) < 1.5:
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        axis.set_minor_formatter(plain)
    else:
        axis.set_minor_locator(LogLocator(base=10, subs=np.arange(2, 10) * 1.0))
        axis.set_minor_formatter(NullFormatter())


def _text_on(color) -> str:
    r, g, b = color[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"
