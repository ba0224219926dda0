"""plan.png: every simulated candidate as GPUs against TTFT p99 (log), one colour per GPU,
circles aggregated and triangles disaggregated, filled where every SLO is met; the frontier
(the least TTFT p99 at each GPU count or fewer), the TTFT target, and the chosen one ringed."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from radixkv.offline.planning.plan import Row
from radixkv.offline.plots.style import config_colors, plain_log_ticks, pyplot, save


def frontier(rows: Sequence[Row]) -> list[tuple[int, float]]:
    """(GPUs, TTFT p99) where the least TTFT p99 among candidates of at most that many GPUs
    drops."""
    out: list[tuple[int, float]] = []
    for r in sorted(rows, key=lambda r: (r.candidate.gpus, r.outcome.ttft_p99 or float("inf"))):
        t = r.outcome.ttft_p99
        if t is not None and (not out or t < out[-1][1]):
            if out and out[-1][0] == r.candidate.gpus:
                out[-1] = (r.candidate.gpus, t)
            else:
                out.append((r.candidate.gpus, t))
    return out


def plot_plan(rows: Sequence[Row], chosen: Row | None, ttft_target: float | None, path: str | Path,
              title: str) -> Path:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    gpus = sorted({r.candidate.family.gpu for r in rows})
    colors = dict(zip(gpus, config_colors(max(len(gpus), 1))))
    fig, ax = plt.subplots(figsize=(8, 5))
    for gpu in gpus:
        for mode, marker in (("aggregated", "o"), ("disaggregated", "^")):
            pts = [r for r in rows if r.candidate.family.gpu == gpu
                   and r.candidate.family.mode == mode and r.outcome.ttft_p99 is not None]
            for meets in (True, False):
                sel = [r for r in pts if r.meets == meets]
                if sel:
                    ax.scatter([r.candidate.gpus for r in sel], [r.outcome.ttft_p99 for r in sel],
                               marker=marker, s=36, alpha=0.85,
                               facecolors=colors[gpu] if meets else "none",
                               edgecolors=colors[gpu],
                               label=f"{gpu} {mode}{'' if meets else ' (misses an SLO)'}")
    front = frontier(rows)
    if front:
        xs, ys = zip(*front)
        right = max(r.candidate.gpus for r in rows)       # the last level holds to the end
        ax.step([*xs, right], [*ys, ys[-1]], where="post", color="0.3", lw=1.2,
                label="frontier")
    if ttft_target is not None:
        ax.axhline(ttft_target, color="tab:red", ls="--", lw=1,
                   label=f"TTFT p99 target {ttft_target:g} s")
    if chosen is not None and chosen.outcome.ttft_p99 is not None:
        ax.scatter([chosen.candidate.gpus], [chosen.outcome.ttft_p99], s=220, facecolors="none",
                   edgecolors="black", lw=1.5, label=f"chosen: {chosen.candidate.label()}")
    ax.set_yscale("log")
    ys = [r.outcome.ttft_p99 for r in rows if r.outcome.ttft_p99] + (
        [ttft_target] if ttft_target is not None else [])
    if ys:
        plain_log_ticks(ax.yaxis, min(ys), max(ys))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("TTFT p99 (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out = save(fig, path)
    plt.close(fig)
    return out
