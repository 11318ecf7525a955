"""PNG charts for runs and comparisons (matplotlib, headless ``Agg`` backend).

Every function writes one PNG and returns its path, so the caller can hand it
to :meth:`rayemb.tracking.run_logger.RunLogger.log_artifact`. Inputs are plain data
(``{label: [(step, value), ...]}``), so the charts can be drawn from what the
driver collected during training or from a store via :func:`metric_history`.

Example::

    >>> hist = {"loss": [(0, 0.69), (10, 0.52)], "auc": [(0, 0.50), (10, 0.71)]}
    >>> plot_training_curves(hist, "out/curves.png")
    'out/curves.png'
    >>> plot_memory_per_rank([3 * 2**30, 2.5 * 2**30], "out/memory.png")
    'out/memory.png'
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # no display on cluster heads; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from rayemb.units import binary_unit  # noqa: E402

Series = Sequence[Tuple[float, float]]

_DPI = 100
_FIGSIZE = (8.0, 4.5)  # inches


def _save(fig: Any, out_path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_path, dpi=_DPI, format="png")
    plt.close(fig)
    return out_path


def plot_curves(series: Mapping[str, Series], out_path: str, title: str, ylabel: str, xlabel: str = "step") -> str:
    """Overlays one line per entry of ``series`` (label -> (x, y) points, drawn in x order)."""
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    drawn = 0
    for label, points in series.items():
        pts = sorted((float(x), float(y)) for x, y in points if y is not None and math.isfinite(float(y)))
        if not pts:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="." if len(pts) < 50 else None, linewidth=1.5, label=str(label))
        drawn += 1
    if drawn == 0:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    elif drawn > 1 or len(series) > 1:
        ax.legend(fontsize="small", loc="best")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return _save(fig, out_path)


def plot_training_curves(history: Mapping[str, Series], out_path: str,
                         metrics: Sequence[str] = ("loss", "auc")) -> str:
    """One panel per metric (default loss and AUC) from a run's metric history.

    A metric is looked up by exact name, else by suffix (``valid/auc`` for
    ``auc``); every matching key is drawn in that panel (``train/loss`` and
    ``valid/loss`` both land in the loss panel).
    """
    fig, axes = plt.subplots(1, len(metrics), figsize=(_FIGSIZE[0] * max(1, len(metrics)) / 1.6, _FIGSIZE[1]),
                             squeeze=False)
    for ax, name in zip(axes[0], metrics):
        keys = [k for k in history if k == name or k.endswith(("/" + name, "." + name, "_" + name))]
        for key in sorted(keys):
            pts = sorted((float(x), float(y)) for x, y in history[key] if math.isfinite(float(y)))
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, linewidth=1.5, label=key)
        if keys:
            ax.legend(fontsize="small", loc="best")
        else:
            ax.text(0.5, 0.5, f"no '{name}' metric", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    return _save(fig, out_path)


def plot_memory_per_rank(bytes_per_rank: Sequence[float], out_path: str,
                         title: str = "Peak memory per rank", capacity_bytes: Optional[float] = None) -> str:
    """Bar chart of memory per rank (index = rank), in the largest fitting binary unit.

    ``capacity_bytes`` (e.g. HBM per GPU) draws a dashed limit line, so a rank
    near its limit stands out.
    """
    values = [float(b) for b in bytes_per_rank]
    scale, unit = binary_unit(max(values + [capacity_bytes or 0.0, 1.0]))
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    bars = ax.bar(range(len(values)), [v / scale for v in values], color="tab:blue")
    for bar, v in zip(bars, values):
        ax.annotate(f"{v / scale:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize="small")
    if capacity_bytes:
        ax.axhline(capacity_bytes / scale, color="tab:red", linestyle="--", label="capacity")
        ax.legend(fontsize="small")
    ax.set_xticks(range(len(values)))
    ax.set_xlabel("rank")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, out_path)


def plot_final_vs_param(points: Sequence[Tuple[Any, float, str]], out_path: str, param: str, metric: str) -> str:
    """Final ``metric`` against a param value, one point per run ((param value, metric, run label)).

    Numeric param values are drawn as a line in value order (e.g. AUC vs
    embedding dim); any other values as bars in first-seen order.
    """
    pts = [(p, float(m), label) for p, m, label in points if m is not None and math.isfinite(float(m))]
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    numeric = bool(pts) and all(_as_float(p) is not None for p, _, _ in pts)
    if not pts:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    elif numeric:
        pts.sort(key=lambda t: _as_float(t[0]))
        xs = [_as_float(p) for p, _, _ in pts]
        ys = [m for _, m, _ in pts]
        ax.plot(xs, ys, marker="o", linewidth=1.5)
        for x, y, (_, _, label) in zip(xs, ys, pts):
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
        ax.set_xlabel(param)
    else:
        labels = [f"{p}\n{label}" for p, _, label in pts]
        ax.bar(range(len(pts)), [m for _, m, _ in pts], color="tab:blue")
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels(labels, fontsize="small")
        ax.set_xlabel(param)
    ax.set_ylabel(f"final {metric}")
    ax.set_title(f"final {metric} vs {param}")
    ax.grid(True, alpha=0.3)
    return _save(fig, out_path)


def _as_float(value: Any) -> Optional[float]:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def metric_history(client: Any, run_id: str, keys: Sequence[str]) -> Dict[str, List[Tuple[int, float]]]:
    """``{key: [(step, value), ...]}`` of a run from an ``MlflowClient`` (missing keys: empty lists)."""
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}
