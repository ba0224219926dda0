"""compare.png: bars of the key figures per configuration, and TTFT CDFs."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def plot_compare(rows: Sequence[dict], ttfts: Sequence[Sequence[float]], path: str | Path,
                 title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    colors = plt.cm.tab10(np.arange(len(rows)) % 10)
    # (key, title, scale, log y): latencies span orders of magnitude between designs
    panels = [("hit_rate", "hit rate", 1.0, False), ("prefill_tokens", "prefill tokens (M)", 1e-6, False),
              ("ttft_p50", "TTFT p50 (s, log)", 1.0, True), ("ttft_p99", "TTFT p99 (s, log)", 1.0, True),
              ("e2e_p99", "E2E p99 (s, log)", 1.0, True), ("evicted_tokens", "evicted tokens (M)", 1e-6, False)]
    fig = plt.figure(figsize=(15, 9), constrained_layout=True)
    grid = fig.add_gridspec(2, len(panels), height_ratios=[1, 1.15])
    for i, (key, label, scale, logy) in enumerate(panels):
        ax = fig.add_subplot(grid[0, i])
        vals = [r[key] * scale for r in rows]
        bars = ax.bar(range(len(rows)), vals, color=colors)
        ax.set_title(label, fontsize=10)
        ax.set_xticks(range(len(rows)), [n.split()[0] for n in names])
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
        if logy:
            ax.set_yscale("log")
            ax.margins(y=0.25)
        else:
            ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    ax = fig.add_subplot(grid[1, :])
    for name, t, c in zip(names, ttfts, colors):
        xs = np.sort(np.asarray(t, dtype=float))
        ax.step(xs, np.arange(1, len(xs) + 1) / max(len(xs), 1), where="post", label=name,
                color=c, lw=1.8)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=12)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
