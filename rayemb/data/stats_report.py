"""Dataset statistics for people: the log-log frequency chart and the terminal table."""

from __future__ import annotations

import math
import os

import numpy as np

from rayemb.data.stats_types import DatasetStats


def plot_frequencies(stats: DatasetStats, png_path: str) -> str:
    """Log-log rank/count plot of every table's heavy hitters, one panel per table in a grid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatter, LogLocator, NullLocator

    names = list(stats.tables)
    cols = max(1, math.ceil(math.sqrt(len(names))))
    grid_rows = max(1, math.ceil(len(names) / cols))
    fig = Figure(figsize=(2.6 * cols, 2.1 * grid_rows))
    FigureCanvasAgg(fig)
    # fixed margins and a few plain major ticks: tight_layout and the mathtext labels of log axes' many
    # ticks took seconds per chart, longer than the rest of a small job's set-up
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.05, top=1 - 0.35 / grid_rows, wspace=0.35, hspace=0.55)
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid_rows, cols, i + 1)
        t = stats.tables[name]
        counts = t.heavy_hitters[:, 1].astype(np.float64)
        counts = counts[counts > 0]
        if counts.size:
            ax.loglog(np.arange(1, counts.size + 1), counts, lw=1.2)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(numticks=4))
            axis.set_major_formatter(LogFormatter(labelOnlyBase=True))
            axis.set_minor_locator(NullLocator())
        ax.set_title(f"{name} (V={t.num_embeddings})", fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"id frequency by rank ({stats.rows:,} rows)", fontsize=10)
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    fig.savefig(png_path, dpi=90)
    return png_path


def format_stats_table(stats: DatasetStats) -> str:
    """A fixed-width per-table summary for the terminal."""
    head = f"{'table':<8}{'V':>11}{'distinct':>11}{'pool':>7}{'top-1 %':>9}{'invalid':>9}{'err':>8}"
    lines = [head, "-" * len(head)]
    for name, t in stats.tables.items():
        hh = t.heavy_hitters
        top = int(hh[0, 1]) / t.values * 100 if hh.size and t.values else 0.0
        approx = "" if t.distinct_exact else "~"
        lines.append(
            f"{name:<8}{t.num_embeddings:>11,}{approx + format(t.distinct, ','):>11}"
            f"{t.pooling_mean:>7.2f}{top:>9.2f}{t.invalid:>9,}{t.error_bound:>8,}"
        )
    return "\n".join(lines)


__all__ = ["plot_frequencies", "format_stats_table"]
