"""cluster.png: one panel per figure (hit rate, TTFT p50 and p99, throughput, imbalance), one
bar per router."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from radixkv.offline.plots.style import bar_panel, config_colors, pyplot, save
from radixkv.offline.cluster.results import ClusterResult

PANELS = (("hit_rate", "pct", "hit rate"), ("ttft_p50", "s", "TTFT p50"),
          ("ttft_p99", "s", "TTFT p99"), ("throughput_tok_s", "tok/s", "throughput"),
          ("imbalance", "x", "imbalance (max / mean tokens per replica)"))


def plot_cluster(results: Sequence[ClusterResult], path: str | Path, title: str) -> Path:
    plt = pyplot()
    colors = config_colors(len(results))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 1.6 + 0.45 * len(results)))
    for i, (ax, (key, kind, name)) in enumerate(zip(axes, PANELS)):
        values = [getattr(r, key) for r in results]
        if key == "hit_rate":
            values = [None if v is None else 100 * v for v in values]
        if kind == "x":
            ax.barh(range(len(values)), values, color=colors, height=0.72)
            ax.set_ylim(len(values) - 0.5, -0.5)
            ax.set_xlim(0, max(values) * 1.3)
            for y, v in enumerate(values):
                ax.annotate(f"{v:.2f}", (v, y), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=8)
            ax.set_title(name, fontsize=10)
        else:
            bar_panel(ax, values, kind, colors, name)
        ax.set_yticks(range(len(results)))
        ax.set_yticklabels([r.router for r in results] if i == 0 else [], fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = save(fig, path)
    plt.close(fig)
    return out
