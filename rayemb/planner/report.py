"""The planner's outputs: ``plan.json`` (read and written), the text tables ``rayemb plan`` prints, ``plan.png``.

None of this imports torch or torchrec: a CPU-only head reads plans
(:func:`load_plan_json`) and charts them. plan.json's fields are documented
in docs/planner.md; byte counts print in binary units
(:func:`rayemb.units.format_bytes`).
"""

from __future__ import annotations

import json
import os

from rayemb.errors import PlanError
from rayemb.planner.types import INVALID_PLAN_FILE, GiB, PlanResult
from rayemb.units import format_bytes


def load_plan_json(path: str) -> PlanResult:
    """Reads ``plan.json`` (no torchrec import: works on a CPU-only head)."""
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise PlanError(f"Plan file {path!r} does not exist. Create it with `rayemb plan --config JOB.yaml --out "
                        f"{path}`.", INVALID_PLAN_FILE) from None
    except json.JSONDecodeError as e:
        raise PlanError(f"Plan file {path!r} is not valid JSON ({e}). Regenerate it with `rayemb plan`.",
                        INVALID_PLAN_FILE) from None
    return PlanResult.from_json(d, source=path)


def save_plan_json(result: PlanResult, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result.to_json(), f, indent=1)
    return path


def summary_table(result: PlanResult, max_rows: int = 40) -> str:
    """Per-table and per-rank text tables (the ranks summarised when there are many)."""
    lines = [f"plan: {len(result.tables)} tables on {result.world_size} ranks, engine={result.engine}, "
             f"predicted {format_bytes(result.predicted_bytes_per_step)}/step, max/mean memory {result.memory_imbalance:.3f}",
             "", f"{'table':<10} {'placement':<18} {'sharding':<18} {'ranks':>8} {'hot_rows':>9} {'memory':>11} {'bytes/step':>11}"]
    items = list(result.tables.values())
    for t in items[:max_rows]:
        rk = f"{len(t.ranks)} rk" if len(t.ranks) > 1 else f"r{t.ranks[0]}" if t.ranks else "-"
        lines.append(f"{t.name:<10} {t.placement.value:<18} {t.sharding_type:<18} {rk:>8} {t.hot_rows:>9} "
                     f"{format_bytes(t.memory_bytes):>11} {format_bytes(t.predicted_bytes_per_step):>11}")
    if len(items) > max_rows:
        lines.append(f"... {len(items) - max_rows} more tables (see plan.json)")
    stored = [t for t in items if t.storage]
    if stored:  # compressed / cached tables: what was chosen and why
        lines += ["", "compressed or cached tables (device / host bytes per rank at most):"]
        for t in stored:
            s = t.storage
            what = _storage_label(s)
            lines.append(f"{t.name:<10} {what}: {format_bytes(s.get('max_device_bytes_per_rank', 0))} device / "
                         f"{format_bytes(s.get('max_host_bytes_per_rank', 0))} host; {s.get('reason', '')}")
    lines += ["", f"{'rank':>6} {'memory':>11} {'capacity':>11} {'used':>7}"]
    ranks = list(result.ranks)
    shown = ranks if len(ranks) <= 16 else sorted(ranks, key=lambda r: -r.memory_bytes)[:8]
    for r in shown:
        lines.append(f"{r.rank:>6} {format_bytes(r.memory_bytes):>11} {format_bytes(r.capacity_bytes):>11} {r.utilization:>6.1%}")
    if len(ranks) > 16:
        lines.append(f"(8 fullest of {len(ranks)} ranks shown; least used {min(r.utilization for r in ranks):.1%})")
    return "\n".join(lines)


def prediction_text(summary: dict, why: str = "") -> str:
    """A job plan's predicted step (plan.json ``predicted_step_time_s``) as the driver prints it: one priced with
    the built-in constants (``prediction: uncalibrated``) says so, and ``why`` (what skipped the calibration),
    so that nobody reads it as the step-time model's figure for this cluster."""
    text = f"predicted {1e3 * summary['predicted_step_time_s']:.1f} ms/step"
    if summary.get("prediction") == "uncalibrated":
        text += " (uncalibrated: built-in constants" + (f", {why})" if why else ")")
    elif summary.get("prediction") == "link-measured":
        text += " (link-measured: the link measured, compute figures built in" + (f", {why})" if why else ")")
    return text


def _storage_label(s: dict) -> str:
    if s.get("compression") == "qr":
        return f"qr m={s.get('buckets')} {s.get('combine')}"
    if s.get("compression") == "block":
        return f"block E_b={s.get('block_dim')}"
    if s.get("kernel") == "cached":
        return f"cached load factor {s.get('cache_load_factor')}, hit rate {s.get('predicted_hit_rate', 0):.2f}"
    return "plain"


def plot_plan(result: PlanResult, path: str) -> str:
    """PNG: per-rank table memory against capacity, and predicted bytes per step by table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    mem = [r.memory_bytes / GiB for r in result.ranks]
    ax1.bar(range(len(mem)), mem, width=1.0, color="tab:blue")
    ax1.axhline(result.ranks[0].capacity_bytes / GiB, color="tab:red", linestyle="--", label="capacity")
    ax1.set_xlabel("rank")
    ax1.set_ylabel("table memory (GiB)")
    ax1.set_title("memory per rank")
    ax1.legend()
    top = sorted(result.tables.values(), key=lambda t: -t.predicted_bytes_per_step)[:30]
    ax2.barh([f"{t.name} ({t.placement.value})" for t in top][::-1],
             [t.predicted_bytes_per_step / 2**20 for t in top][::-1], color="tab:orange")
    ax2.set_xlabel("predicted MiB per step (all ranks, fwd+bwd)")
    ax2.set_title(f"traffic: {result.predicted_bytes_per_step / 2**20:.1f} MiB/step total")
    ax2.tick_params(axis="y", labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["load_plan_json", "save_plan_json", "summary_table", "plot_plan", "prediction_text"]
