"""four_way.png: the hit rate (from the servers' counters) and the TTFT p99 per configuration."""
from __future__ import annotations

from pathlib import Path

from radixkv.offline.plots.style import pyplot


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Bars of the hit rate (from the counters) and the TTFT p99 per configuration."""
    plt = pyplot()
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label, scale in ((axes[0], "hit_rate", "prefix-cache hit rate (%)", 100),
                                  (axes[1], "ttft_p99", "TTFT p99 (s)", 1)):
        values = [0.0 if r[key] is None else r[key] * scale for r in rows]
        bars = ax.bar(names, values, color=["#4c72b0", "#55a868", "#c44e52", "#8c8c8c"])
        ax.bar_label(bars, labels=["-" if r[key] is None else f"{r[key] * scale:.3g}"
                                   for r in rows])
        ax.margins(y=0.12)                  # room for the labels above the bars
        ax.set_ylabel(label)
        ax.set_title(label)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
