"""sweep.png: hit rate against KV memory, one curve per cache and eviction order, with the
unlimited cache's ceiling and the memory each curve needs for 50, 80 and 90 % of it."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from radixkv.offline.planning.sweep import SweepRow, capacity_for
from radixkv.offline.plots.style import config_colors, plain_log_ticks, pyplot, save

SHARES = (0.5, 0.8, 0.9)               # of the ceiling: the capacities annotated
_MARKERS = {0.5: "o", 0.8: "s", 0.9: "D"}


def x_of(row: SweepRow, in_bytes: bool) -> float:
    """A row's position on the x axis: GiB of KV (with a model) or tokens."""
    return row.capacity_bytes / 2**30 if in_bytes else float(row.capacity_tokens)


def format_x(x: float | None, in_bytes: bool) -> str:
    if x is None:
        return "not reached"
    if in_bytes:
        return f"{x:.3g} GiB" if x < 100 else f"{x:,.0f} GiB"
    if x >= 1e6:
        return f"{x / 1e6:.3g}M tok"
    if x >= 1e3:
        return f"{x / 1e3:.3g}k tok"
    return f"{x:.0f} tok"


def lines_of_rows(rows: Sequence[SweepRow]) -> dict[str, list[SweepRow]]:
    """Rows by curve, in first-seen order, each sorted by capacity."""
    out: dict[str, list[SweepRow]] = {}
    for r in rows:
        out.setdefault(r.line, []).append(r)
    return {k: sorted(v, key=lambda r: r.capacity_tokens) for k, v in out.items()}


def needed(rows: Sequence[SweepRow], ceiling: float, in_bytes: bool
           ) -> dict[str, dict[float, float | None]]:
    """curve -> share -> the smallest swept x (GiB or tokens) at share x ceiling, or None."""
    return {name: {s: capacity_for([x_of(r, in_bytes) for r in rs], [r.hit_rate for r in rs],
                                   s * ceiling) for s in SHARES}
            for name, rs in lines_of_rows(rows).items()}


def smallest(rows: Sequence[SweepRow], in_bytes: bool) -> dict[str, float | None]:
    """curve -> its smallest swept x with a hit rate: a share already reached there may be
    reached by a smaller pool too, which no replay can check (a request would not fit)."""
    return {name: min((x_of(r, in_bytes) for r in rs if r.hit_rate is not None), default=None)
            for name, rs in lines_of_rows(rows).items()}


def format_need(x: float | None, first: float | None, in_bytes: bool) -> str:
    """"3.31 GiB", "<= 0.535 GiB" when reached at the smallest pool swept, "-" if never."""
    if x is None or not math.isfinite(x):
        return "-"
    return ("<= " if x == first else "") + format_x(x, in_bytes)


def plot_sweep(rows: Sequence[SweepRow], path: str | Path, title: str = "",
               ceiling: float | None = None) -> Path:
    """The picture; `ceiling` is the unlimited cache's hit rate (default: the highest hit rate
    swept). The x axis is GiB of KV when every row has its bytes, else tokens; log scale."""
    plt = pyplot()
    in_bytes = bool(rows) and all(r.capacity_bytes is not None for r in rows)
    curves = lines_of_rows(rows)
    if ceiling is None:
        ceiling = max((r.hit_rate for r in rows if r.hit_rate is not None), default=0.0)
    need = needed(rows, ceiling, in_bytes)
    first = smallest(rows, in_bytes)
    fig, ax = plt.subplots(figsize=(12, 7.2), layout="constrained")
    try:
        _draw(ax, curves, need, first, ceiling, in_bytes)
        if title:
            ax.set_title(title, fontsize=11)
        return save(fig, path)
    finally:
        plt.close(fig)


def _draw(ax, curves: dict[str, list[SweepRow]], need: dict, first: dict, ceiling: float,
          in_bytes: bool) -> None:
    from matplotlib.lines import Line2D
    colors = dict(zip(curves, config_colors(len(curves))))
    xs_all = [x_of(r, in_bytes) for rs in curves.values() for r in rs if r.hit_rate is not None]
    for name, rs in curves.items():
        pts = [(x_of(r, in_bytes), 100 * r.hit_rate) for r in rs if r.hit_rate is not None]
        method = rs[0].method if rs else ""
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[name], lw=1.8,
                marker=".", ms=5, ls="-" if method == "one-pass" else "--",
                label=f"{name} ({method})")
        for s, x in need[name].items():
            if x is not None:
                y = next(100 * r.hit_rate for r in rs if x_of(r, in_bytes) == x)
                ax.plot([x], [y], marker=_MARKERS[s], ms=8, mfc="white", mec=colors[name],
                        mew=1.8, zorder=5)
    top = 100 * ceiling
    ax.axhline(top, color="0.25", lw=1.2, ls=":")
    ax.annotate(f"unlimited cache (ceiling): {top:.1f}%", (1, top),
                xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                fontsize=9, color="0.25", ha="right")
    for s in SHARES:
        ax.axhline(s * top, color="0.6", lw=0.7, ls=(0, (2, 4)))
        # between the legend (lower left) and the table (lower right), which may cover a guide
        ax.annotate(f"{s:.0%} of ceiling", (0.42, s * top), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8, color="0.45",
                    ha="center")
    if xs_all:
        ax.set_xscale("log")
        lo, hi = min(xs_all), max(xs_all)
        if hi > lo:
            ax.set_xlim(lo / 1.15, hi * 1.15)
            plain_log_ticks(ax.xaxis, lo / 1.15, hi * 1.15)
    # from a round number under both the 50% guide and the lowest point: the curves use the
    # height, and the axis label says where it starts
    ys = [100 * r.hit_rate for rs in curves.values() for r in rs if r.hit_rate is not None]
    bottom = 10 * math.floor(min([SHARES[0] * top, *ys]) / 10 - 0.05)
    ax.set_ylim(max(bottom, 0), max(top, 1.0) * 1.06 + 1)
    ax.set_xlabel("KV memory (GiB per GPU, log scale)" if in_bytes
                  else "KV pool (tokens, log scale)")
    ax.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    ax.grid(alpha=0.3, which="major")
    ax.grid(alpha=0.12, which="minor")
    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], ls="none", marker=_MARKERS[s], mfc="white", mec="0.3", ms=8)
                for s in SHARES]
    labels += [f"first swept pool at {s:.0%} of ceiling" for s in SHARES]
    ax.legend(handles, labels, loc="lower left", fontsize=8.5, framealpha=0.92)
    ax.text(0.99, 0.03, _need_table(need, first, in_bytes), transform=ax.transAxes, ha="right",
            va="bottom", fontsize=8.5, family="monospace",
            bbox={"facecolor": "white", "alpha": 0.92, "edgecolor": "0.7"})


def _need_table(need: dict[str, dict[float, float | None]], first: dict, in_bytes: bool) -> str:
    """Memory each curve needs, as a small fixed-width table."""
    width = max((len(n) for n in need), default=0)
    head = "memory for".ljust(width) + "".join(f"{f'{s:.0%} of ceiling':>17}" for s in SHARES)
    body = [name.ljust(width) + "".join(f"{format_need(need[name][s], first[name], in_bytes):>17}"
                                         for s in SHARES) for name in need]
    note = "<=: reached at the smallest pool that fits every request"
    return "\n".join([head, *body, note])
