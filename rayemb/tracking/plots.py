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
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

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


class TrialPoint(NamedTuple):
    """One trial of a sweep as its charts see it: swept key -> value, its metric (None: none logged), and
    whether the scheduler stopped it early."""

    params: Mapping[str, Any]
    metric: Optional[float]
    killed: bool = False


#: a numeric key whose values span at least this ratio (two decades) gets a log axis
LOG_AXIS_SPAN = 100.0


def _param_axis(values: Sequence[Any]) -> Tuple[str, List[Any]]:
    """How to draw a swept key: ``("log"|"linear", [])`` for numbers, ``("category", sorted distinct values)``
    for anything else (strings, bools)."""
    nums = [_as_float(v) for v in values]
    if values and all(n is not None for n in nums):
        lo, hi = min(nums), max(nums)
        return ("log" if lo > 0 and hi / lo >= LOG_AXIS_SPAN else "linear"), []
    return "category", sorted({str(v) for v in values})


def plot_trials_vs_param(trials: Sequence[TrialPoint], out_path: str, param: str, metric: str,
                         mode: str = "max") -> str:
    """Each trial's ``metric`` against its value of ``param``; early-stopped trials hollow, the best starred.

    A numeric param spanning two decades or more gets a log x axis; strings and
    bools are categories (jittered a little so equal trials stay visible).
    """
    pts = [t for t in trials if param in t.params and t.metric is not None and math.isfinite(t.metric)]
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    kind, cats = _param_axis([t.params[param] for t in pts])

    def x_of(i: int, t: TrialPoint) -> float:
        if kind != "category":
            return _as_float(t.params[param])
        return cats.index(str(t.params[param])) + 0.06 * ((i % 5) - 2)

    if not pts:
        ax.text(0.5, 0.5, "no trial logged the metric", ha="center", va="center", transform=ax.transAxes)
    for killed, style in ((False, dict(color="tab:blue", label="finished")),
                          (True, dict(facecolors="none", edgecolors="tab:orange", label="stopped early"))):
        xy = [(x_of(i, t), t.metric) for i, t in enumerate(pts) if t.killed == killed]
        if xy:
            ax.scatter(*zip(*xy), s=46, linewidths=1.5, zorder=3, **style)
    if pts:
        best = (max if mode == "max" else min)(range(len(pts)), key=lambda i: pts[i].metric)
        ax.scatter([x_of(best, pts[best])], [pts[best].metric], marker="*", s=260, color="gold",
                   edgecolors="black", zorder=4, label="best")
        ax.legend(fontsize="small", loc="best")
    if kind == "log":
        ax.set_xscale("log")
    elif kind == "category":
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats)
        ax.set_xlim(-0.5, len(cats) - 0.5)
    ax.set_xlabel(param + (" (log scale)" if kind == "log" else ""))
    ax.set_ylabel(f"best {metric} ({mode})")
    ax.set_title(f"{metric} vs {param}: {len(pts)} trials")
    ax.grid(True, alpha=0.3)
    return _save(fig, out_path)


def plot_parallel_coordinates(trials: Sequence[TrialPoint], out_path: str, params: Sequence[str], metric: str,
                              mode: str = "max") -> str:
    """One vertical axis per swept key plus the metric, one line per trial colored by its metric.

    Each axis is scaled to its own range (log for a key spanning two decades,
    even spacing for categories) and labelled with its real values at the ends;
    early-stopped trials are dashed. Trials without the metric are left out.
    """
    pts = [t for t in trials if t.metric is not None and math.isfinite(t.metric)]
    cols = list(params) + [metric]
    fig, ax = plt.subplots(figsize=(max(_FIGSIZE[0], 2.2 * len(cols)), _FIGSIZE[1]))
    scaled: List[List[float]] = [[] for _ in pts]
    ticks: List[Tuple[List[float], List[str]]] = []
    for col in cols:
        values = [t.metric if col == metric else t.params.get(col) for t in pts]
        kind, cats = _param_axis([v for v in values if v is not None])
        if kind == "category":
            pos = {c: (i / (len(cats) - 1) if len(cats) > 1 else 0.5) for i, c in enumerate(cats)}
            ys = [pos.get(str(v), math.nan) if v is not None else math.nan for v in values]
            ticks.append((list(pos.values()), cats))
        else:
            raw = [_as_float(v) if v is not None else None for v in values]
            fwd = math.log10 if kind == "log" else float
            known = [fwd(v) for v in raw if v is not None]
            lo, hi = (min(known), max(known)) if known else (0.0, 1.0)
            span = hi - lo or 1.0
            ys = [(fwd(v) - lo) / span if v is not None else math.nan for v in raw]
            ends = [v for v in raw if v is not None]
            ticks.append(([0.0, 1.0], [f"{min(ends):.4g}", f"{max(ends):.4g}"] if ends else ["", ""]))
        for row, y in zip(scaled, ys):
            row.append(y)
    xs = list(range(len(cols)))
    if pts:
        metrics = [t.metric for t in pts]
        norm = matplotlib.colors.Normalize(min(metrics), max(metrics))
        cmap = plt.get_cmap("viridis" if mode == "max" else "viridis_r")
        for t, row in sorted(zip(pts, scaled), key=lambda p: p[0].metric * (1 if mode == "max" else -1)):
            ax.plot(xs, row, color=cmap(norm(t.metric)), linewidth=2, alpha=0.85, marker="o", markersize=4,
                    linestyle="--" if t.killed else "-")
        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=metric)
    else:
        ax.text(0.5, 0.5, "no trial logged the metric", ha="center", va="center", transform=ax.transAxes)
    for x, (pos, labels) in zip(xs, ticks):
        ax.axvline(x, color="black", linewidth=0.8)
        for p, label in zip(pos, labels):
            ax.annotate(label, (x, p), textcoords="offset points", xytext=(5, 0), va="center", fontsize="x-small",
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85),
                        zorder=5)
    ax.set_xticks(xs)
    ax.set_xticklabels(cols, fontsize="small")
    ax.set_yticks([])
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlim(-0.2, len(cols) - 0.6)
    ax.set_title(f"{len(pts)} trials by {metric} (dashed: stopped early)")
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
