"""The job's calibration (a driver stage): measured on the live cluster, or kept from an earlier job of the same
shape on the same hardware.

Measuring the step-time model's constants takes seconds to tens of seconds at every job start, and a job
resubmitted with another learning rate measures the same thing again. A calibration is stored under the
job's output storage (``tracking.output_dir``, local or a URI)::

    <output_dir>/calibrations/<shape key>/<key>.json    {"key_fields": {...}, "measured_at": <unix s>,
                                                         "measured": {...}}

``key`` hashes everything the measurement depends on: the ranks (count, CPUs each, GPU or not, nodes,
placement strategy), the cluster's nodes (CPUs, GPUs and accelerator type of each), the job's local batch,
dense and sparse feature counts, dim, MLPs, input prefetch, the model (name and arguments), the versions of
torch, fbgemm, TorchRec, Ray and rayemb, and the hardware (``hardware``): the CPU model of the ranks' hosts
and the link between them, as the factor-of-2 band of a 1 MiB all-to-all's bandwidth
(:func:`rayemb.train.calibration.calibrate.link_fingerprint`; ranks on one host: ``one host``). So another cluster of the
same shape sharing the output storage, or the same cluster after its network changed, measures anew. The
``<shape key>`` is the key without the hardware: the hardware is measured (about a second, with the ranks'
start) only when a calibration of the job's shape is kept, else it comes with the calibration.

A stored calibration younger than ``planner.calibration_max_age_h`` is used instead of measuring (plan.json's
``calibration.source`` says ``cached``, its ``age_s`` how long ago it was measured); one whose figures are
missing, not finite or negative where they cannot be is ignored with a warning naming its file, and measured
anew. ``planner.recalibrate: true`` measures anew and replaces it. The plan probe's step times are kept the
same way, keyed also by its candidate plans (:func:`rayemb.train.calibration.plan_probe.choose_by_probe`).

After training, the job's measured step over the model's prediction is kept beside the calibration it predicted
with (``<shape key>/<key>.ratio``, the key with the prediction's kind: :func:`learn_ratio`), with each measured
plan's predicted seconds by step-time family (the job's, and the plan probe's candidates when it measured them).
The next job on that key scales each family by its own ratio when those plans' mixes of the families tell them
apart (:func:`fit_family_ratios`), else its whole prediction by the median of the last few overall ratios
(:func:`with_learned_ratio`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rayemb import storage

CACHE_DIR = "calibrations"


def _versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "ray", "rayemb"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def cluster_nodes() -> List[Tuple[float, float, str]]:
    """(CPUs, GPUs, accelerator types) of every alive node of the connected Ray cluster, sorted."""
    import ray

    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        accel = ",".join(sorted(k for k in res if k.startswith("accelerator_type:")))
        nodes.append((float(res.get("CPU", 0)), float(res.get("GPU", 0)), accel))
    return sorted(nodes)


def key_fields(shape: Mapping[str, Any], ranks: Mapping[str, Any], nodes: List[Tuple[float, float, str]],
               hardware: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """What a calibration depends on (module docstring), as plain JSON values. ``hardware``: the ranks' link and
    CPU models (:func:`rayemb.train.calibration.calibrate.hardware_key`; None: not measured yet, the shape's fields only)."""
    model = shape.get("model")
    schema = shape.get("schema")
    plain = {k: v for k, v in shape.items() if k not in ("model", "schema")}
    out = {"shape": plain, "model": None if model is None else {"name": model.name, "args": dict(model.args)},
           "labels": None if schema is None else len(schema.labels), "ranks": dict(ranks),
           "nodes": [list(n) for n in nodes], "versions": _versions()}
    if hardware is not None:
        out["hardware"] = dict(hardware)
    return out


def cache_key(fields: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shape_dir(out_dir: str, fields: Mapping[str, Any]) -> str:
    """Where the measurements of ``fields``' shape are kept, whatever the hardware."""
    return storage.join(out_dir, CACHE_DIR, cache_key({k: v for k, v in fields.items() if k != "hardware"}))


def cache_path(out_dir: str, fields: Mapping[str, Any]) -> str:
    return storage.join(shape_dir(out_dir, fields), f"{cache_key(fields)}.json")


def any_kept(out_dir: str, fields: Mapping[str, Any]) -> bool:
    """Whether a measurement of ``fields``' shape (``hardware`` left aside) is kept, on any hardware."""
    try:
        return bool(storage.list_files(shape_dir(out_dir, fields), ".json"))
    except Exception:  # noqa: BLE001 - unlistable storage: nothing to reuse, measuring is the way out
        return False


#: beside a shape's kept calibration: when a plan probe of that shape was last kept (the probe's own file is keyed
#: by its candidate plans, known only once the plan is made)
PROBE_MARK = "plan_probe_kept"


def mark_probe_kept(out_dir: str, fields: Mapping[str, Any], now: Optional[float] = None) -> None:
    """Notes that a plan probe of ``fields``' shape (the job's key fields) was kept."""
    storage.write_text(storage.join(shape_dir(out_dir, fields), PROBE_MARK),
                       json.dumps({"measured_at": time.time() if now is None else now}))


def probe_kept(out_dir: str, fields: Mapping[str, Any], max_age_s: float, now: Optional[float] = None) -> bool:
    """Whether a plan probe of ``fields``' shape was kept within ``max_age_s``: then the next job of that shape
    most likely reads its probe too, and measures nothing on the cluster."""
    if max_age_s <= 0:
        return False
    try:
        measured_at = float(json.loads(storage.read_text(storage.join(shape_dir(out_dir, fields), PROBE_MARK)))
                            ["measured_at"])
    except Exception:  # noqa: BLE001 - none, or unreadable: the job probes, before its workers start
        return False
    return 0 <= (time.time() if now is None else now) - measured_at <= max_age_s


def _ignored(path: str, why: str) -> None:
    from rayemb.logs import redact_uri

    print(f"rayemb: WARNING: ignoring the kept measurement {redact_uri(path)} ({why}); measuring anew", flush=True)


def load_kept(out_dir: str, fields: Mapping[str, Any], max_age_s: float,
              now: Optional[float] = None) -> Optional[Tuple[Dict[str, Any], float, str]]:
    """(the kept measurement, its age in seconds, where) of these ``fields`` when younger than ``max_age_s``, else
    None: measuring is always the way out. A file that cannot be read is ignored with a warning naming it."""
    if max_age_s <= 0:
        return None
    path = cache_path(out_dir, fields)
    try:
        if not storage.exists(path):
            return None
        doc = json.loads(storage.read_text(path))
        if doc.get("key_fields") != json.loads(json.dumps(fields, sort_keys=True, default=str)):
            return None  # a hash collision or a hand-edited file
        measured_at = float(doc["measured_at"])
        measured = doc["measured"]
        if not math.isfinite(measured_at) or not isinstance(measured, dict):
            raise ValueError("no measurement time or no measurement")
    except Exception as e:  # noqa: BLE001 - a damaged entry is a miss, not a failed job
        _ignored(path, f"{type(e).__name__}: {e}")
        return None
    age = (time.time() if now is None else now) - measured_at
    if not 0 <= age <= max_age_s:
        return None
    return dict(measured), age, path


def store_kept(out_dir: str, fields: Mapping[str, Any], measured: Mapping[str, Any], now: Optional[float] = None) -> str:
    """Keeps ``measured`` (JSON values) as the measurement of ``fields``; returns where."""
    path = cache_path(out_dir, fields)
    doc = {"key_fields": fields, "measured_at": time.time() if now is None else now, "measured": dict(measured)}
    storage.write_text(path, json.dumps(doc, sort_keys=True, indent=1, default=str))
    return path


def _finite(value: Any, name: str, low: float = -math.inf, strict: bool = False) -> float:
    """``value`` as a float, when a finite number above ``low`` (at least ``low`` unless ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} is {value!r}, not a number")
    x = float(value)
    if not math.isfinite(x) or x < low or (strict and x <= low):
        raise ValueError(f"{name} is {x!r}; it must be a finite number {'>' if strict else '>='} {low:g}")
    return x


#: a calibration's figures that a measurement never makes 0: every step and every module group costs time
_POSITIVE = ("dense_step_s", "group_overhead_s")
#: figures that are slopes or shares, clamped at 0 when measured
_NON_NEGATIVE = ("lookup_s", "dense_lookup_s", "replicated_elem_s", "pool_s", "seconds", "dense_sync_bytes", "step_ratio",
                 "ddp_step_s", "age_s", "probe_hot_share", "probe_hot_rows", "world_size", "num_nodes")
#: the probes' table sizes: a per-table figure is netted of their rows
_COUNTS = ("probe_rows", "probe_dp_rows")


def check_calibration(d: Mapping[str, Any]) -> Any:
    """The :class:`~rayemb.planner.step_time.Calibration` a kept dict holds; ``ValueError`` naming the figure when
    one is missing, unknown, not finite, or negative (0 too, for a step's and a module group's time)."""
    from dataclasses import MISSING, fields

    from rayemb.planner.step_time import Calibration

    known = {f.name: f for f in fields(Calibration)}
    missing = sorted(n for n, f in known.items() if n not in d and f.default is MISSING
                     and f.default_factory is MISSING)
    if missing:
        raise ValueError(f"missing {missing}")
    if set(d) - set(known):
        raise ValueError(f"unknown {sorted(set(d) - set(known))}")
    for link in ("all_reduce", "all_to_all"):
        if not isinstance(d[link], dict) or set(d[link]) != {"latency_s", "seconds_per_byte"}:
            raise ValueError(f"{link} is {d[link]!r}, not {{latency_s, seconds_per_byte}}")
        for k, v in d[link].items():
            _finite(v, f"{link}.{k}", 0.0)
    for name in _POSITIVE:
        _finite(d[name], name, 0.0, strict=True)
    for name in _NON_NEGATIVE + _COUNTS:
        if name in d:
            _finite(d[name], name, 0.0, strict=name in _COUNTS)
    ratios = d.get("family_ratios") or {}
    if not isinstance(ratios, dict):
        raise ValueError(f"family_ratios is {ratios!r}, not {{family: ratio}}")
    for family, r in ratios.items():
        _finite(r, f"family_ratios.{family}", 0.0)
    for kind, pair in dict(d.get("groups") or {}).items():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"groups.{kind} is {pair!r}, not (fixed seconds, seconds per table)")
        _finite(pair[0], f"groups.{kind} fixed")
        _finite(pair[1], f"groups.{kind} per table", 0.0)
    return Calibration.from_dict(d)


def load_calibration(out_dir: str, fields: Mapping[str, Any], max_age_s: float,
                     now: Optional[float] = None) -> Optional[Tuple[Any, float, str]]:
    """(calibration, its age in seconds, where) kept for these ``fields`` (:func:`load_kept`), else None."""
    kept = load_kept(out_dir, fields, max_age_s, now)
    if kept is None:
        return None
    measured, age, path = kept
    try:
        cal = check_calibration(measured)
    except Exception as e:  # noqa: BLE001 - damaged or of another layout: measured anew
        _ignored(path, f"{type(e).__name__}: {e}")
        return None
    return replace(cal, source="cached", seconds=0.0, age_s=age), age, path


def store_calibration(out_dir: str, fields: Mapping[str, Any], cal: Any, now: Optional[float] = None) -> str:
    return store_kept(out_dir, fields, cal.to_dict(), now)


#: the newest measured-over-predicted step ratios kept per key; their median is what the next job applies
LEARNED_RATIOS = 5
#: a ratio outside these bounds is a broken run (a stall, a wrong window), not the model's bias: never kept
RATIO_BOUNDS = (0.01, 100.0)
#: the newest (predicted seconds by family, measured step) pairs kept per key, the jobs' and the plan probes'
LEARNED_PAIRS = 20
#: a fitted family ratio is held within these bounds: beyond them a family is mispriced past what one ratio mends
FAMILY_RATIO_BOUNDS = (0.25, 4.0)
#: the smallest singular value, over the largest, of the pairs' (column-normalized) families for a per-family
#: fit: below it two families move together over the measured plans and their split is noise
FAMILY_FIT_RCOND = 1e-3


def ratio_file(fields: Mapping[str, Any], kind: str) -> str:
    """Where, relative to the output storage, the learned step ratios of ``fields`` (a calibration's key, with its
    ``hardware``) and a prediction of ``kind`` (plan.json ``prediction``) are kept: beside that calibration, in its
    shape's folder, as ``.ratio`` (not ``.json``: a ratio alone is no kept calibration for :func:`any_kept`)."""
    shape = cache_key({k: v for k, v in fields.items() if k != "hardware"})
    return f"{CACHE_DIR}/{shape}/{cache_key({**fields, 'learned': kind})}.ratio"


def _pair(d: Any) -> Dict[str, Any]:
    """A kept (predicted seconds by family, measured step) pair, checked: ``ValueError`` naming what is wrong."""
    from rayemb.planner.step_time import FAMILIES

    if not isinstance(d, dict) or not isinstance(d.get("families"), dict):
        raise ValueError(f"pair {d!r} holds no families")
    fams = d["families"]
    if set(fams) != set(FAMILIES) | {"overlap"}:
        raise ValueError(f"pair families are {sorted(fams)}, not {sorted(FAMILIES) + ['overlap']}")
    out = {f: _finite(fams[f], f"pair {f}", 0.0) for f in FAMILIES}
    out["overlap"] = _finite(fams["overlap"], "pair overlap", -math.inf)
    return {"families": out, "measured_s": _finite(d.get("measured_s"), "pair measured_s", 0.0, strict=True),
            "source": str(d.get("source", "job"))}


def load_learned(out_dir: str, rel: str) -> Tuple[List[float], List[Dict[str, Any]]]:
    """(the overall ratios, the (families, measured step) pairs) kept at ``rel`` (:func:`ratio_file`), oldest
    first; ([], []) when none or unreadable (with a warning). A file kept before pairs were: its ratios alone."""
    path = storage.join(out_dir, *rel.split("/"))
    try:
        if not storage.exists(path):
            return [], []
        doc = json.loads(storage.read_text(path))
        ratios = [_finite(r, "ratio", RATIO_BOUNDS[0], strict=True) for r in doc["ratios"]][-LEARNED_RATIOS:]
        pairs = [_pair(p) for p in doc.get("pairs") or []][-LEARNED_PAIRS:]
        return ratios, pairs
    except Exception as e:  # noqa: BLE001 - a damaged entry teaches nothing; the model's own figure stands
        from rayemb.logs import redact_uri

        print(f"rayemb: WARNING: ignoring the learned step ratios {redact_uri(path)} ({type(e).__name__}: {e})",
              flush=True)
        return [], []


def load_ratios(out_dir: str, rel: str) -> List[float]:
    """The overall ratios kept at ``rel`` (:func:`load_learned`), oldest first."""
    return load_learned(out_dir, rel)[0]


def _bounded_lstsq(a: Any, b: Any, low: float, high: float) -> Any:
    """argmin |a x - b| over x in [low, high] (a of full column rank, a few columns): the optimum is the
    unconstrained solution of its free variables with the others at a bound, so every such split is solved and
    the best feasible one kept (the first on a tie: the same pairs, the same ratios)."""
    import itertools

    import numpy as np

    n = a.shape[1]
    best, best_res = None, 0.0
    for states in itertools.product((None, low, high), repeat=n):
        x = np.array([s if s is not None else 0.0 for s in states])
        free = [i for i, s in enumerate(states) if s is None]
        if free:
            rest = b - a @ x
            x[free] = np.linalg.lstsq(a[:, free], rest, rcond=None)[0]
            if np.any(x[free] < low - 1e-12) or np.any(x[free] > high + 1e-12):
                continue
        res = float(np.sum((a @ x - b) ** 2))
        if best is None or res < best_res - 1e-15 * max(1.0, best_res):
            best, best_res = x, res
    return best


def fit_family_ratios(pairs: List[Mapping[str, Any]]) -> Optional[Dict[str, float]]:
    """Measured over predicted seconds per step-time family (:data:`~rayemb.planner.step_time.FAMILIES`) that
    best explain ``pairs`` (:func:`load_learned`): ``measured = Σ ratio_f · predicted_f + overlap``, least squares
    in relative error (each plan counts alike, whatever its step), each ratio within
    :data:`FAMILY_RATIO_BOUNDS`. A family no pair predicts any time for keeps 1.0. None when the pairs cannot
    tell the families apart: fewer distinct mixes than families, or two families moving together over them
    (:data:`FAMILY_FIT_RCOND`); then one overall ratio is what can be learned."""
    import numpy as np

    from rayemb.planner.step_time import FAMILIES

    if not pairs:
        return None
    x = np.array([[p["families"][f] for f in FAMILIES] for p in pairs], dtype=np.float64)
    m = np.array([p["measured_s"] for p in pairs], dtype=np.float64)
    y = m - np.array([p["families"]["overlap"] for p in pairs], dtype=np.float64)
    a, b = x / m[:, None], y / m
    norms = np.linalg.norm(a, axis=0)
    active = [i for i in range(len(FAMILIES)) if norms[i] > 1e-12 * max(float(norms.max()), 1e-300)]
    if not active or len(pairs) < len(active):
        return None
    sv = np.linalg.svd(a[:, active] / norms[active], compute_uv=False)
    if sv[-1] < FAMILY_FIT_RCOND * sv[0]:
        return None
    fitted = _bounded_lstsq(a[:, active], b, *FAMILY_RATIO_BOUNDS)
    out = {f: 1.0 for f in FAMILIES}
    out.update({FAMILIES[i]: float(r) for i, r in zip(active, fitted)})
    return out


def with_learned_ratio(out_dir: str, fields: Optional[Mapping[str, Any]], cal: Any,
                       apply: bool = True) -> Tuple[Any, Dict[str, Any]]:
    """(``cal`` with what was learned on its key, plan.json's ``learned_ratio``: ``{"fit": "per component",
    "overall" or None, "applied": the overall ratio or None, "families": the family ratios or None, "jobs": how
    many overall ratios, "pairs": how many measured plans, "file": where, relative to the output storage}``).

    Per component (``family_ratios``) when the kept pairs tell the families apart (:func:`fit_family_ratios`),
    else overall: the median of the jobs' ratios (``step_ratio``: every component scaled by it). A calibration
    keyed nowhere (None ``fields``) learns nothing; with ``apply`` false (``planner.recalibrate``) the job
    predicts without the ratios and still leaves its own."""
    import statistics

    from rayemb.planner.step_time import prediction_kind

    if cal is None or fields is None:
        return cal, {}
    rel = ratio_file(fields, prediction_kind(cal))
    ratios, pairs = load_learned(out_dir, rel) if apply else ([], [])
    families = fit_family_ratios(pairs)
    applied = statistics.median(ratios) if ratios and families is None else None
    if families is not None:
        cal = replace(cal, family_ratios=families)
    elif applied is not None:
        cal = replace(cal, step_ratio=applied)
    fit = "per component" if families is not None else "overall" if applied is not None else None
    return cal, {"fit": fit, "applied": applied, "families": families, "jobs": len(ratios), "pairs": len(pairs),
                 "file": rel}


def _probe_pairs(summary: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The plan probe's candidates as pairs, when this job measured them (a kept probe's are kept already)."""
    probe = summary.get("plan_probe") or {}
    if probe.get("source") != "measured":
        return []
    out = []
    for c in probe.get("candidates") or []:
        try:
            out.append(_pair({"families": c.get("predicted_step_time_families_s"),
                              "measured_s": c.get("probed_step_time_s"), "source": "probe"}))
        except ValueError:
            continue  # a candidate planned without its families: its step says nothing per family
    return out


def _within_bounds(pair: Mapping[str, Any]) -> bool:
    predicted = sum(pair["families"].values())
    return predicted > 0 and RATIO_BOUNDS[0] < pair["measured_s"] / predicted < RATIO_BOUNDS[1]


def learn_ratio(out_dir: str, summary: Mapping[str, Any], measured_s: Optional[float],
                now: Optional[float] = None) -> Optional[float]:
    """Keeps, for the next job on the same key (plan.json ``learned_ratio``), the job's measured step over the
    model's own prediction (the plan's ``predicted_step_time_families_s`` summed, else its
    ``predicted_step_time_s`` with any applied overall ratio taken off), and the (families, measured step) pairs
    of the job and of the plan probe's candidates when it measured them. Returns the job's ratio, or None when
    the job has nothing to learn from (no key, no measurement, a ratio out of :data:`RATIO_BOUNDS`); the probe's
    pairs are kept even then."""
    learned = summary.get("learned_ratio") or {}
    if not learned.get("file"):
        return None
    new_pairs = [p for p in _probe_pairs(summary) if _within_bounds(p)]
    ratio = None
    own = summary.get("predicted_step_time_families_s")
    predicted = summary.get("predicted_step_time_s")
    if measured_s and (own or predicted):
        model = sum(own.values()) if own else float(predicted) / (learned.get("applied") or 1.0)
        ratio = float(measured_s) / model if model > 0 else None
        if ratio is not None and not RATIO_BOUNDS[0] < ratio < RATIO_BOUNDS[1]:
            ratio = None
        if ratio is not None and own:
            try:
                new_pairs.append(_pair({"families": own, "measured_s": measured_s, "source": "job"}))
            except ValueError:
                pass
    if ratio is None and not new_pairs:
        return None
    ratios, pairs = load_learned(out_dir, learned["file"])
    if ratio is not None:
        ratios = (ratios + [ratio])[-LEARNED_RATIOS:]
    pairs = (pairs + new_pairs)[-LEARNED_PAIRS:]
    storage.write_text(storage.join(out_dir, *learned["file"].split("/")), json.dumps(
        {"ratios": ratios, "pairs": pairs, "measured_at": time.time() if now is None else now}, indent=1))
    return ratio


def job_key_fields(inputs: Any, topology: Any, resources: Any, shape: Mapping[str, Any]) -> Dict[str, Any]:
    """The key fields of the job's measurements (its calibration of ``shape``; with ``"probe"`` added, its plan
    probe, which times the job's own step: so the step's precision and the tables' dtype are in the key too)."""
    cfg = inputs.cfg
    ranks = {"world": inputs.world_size, "cpus_per_worker": resources.cpus_per_worker, "gpu": cfg.scaling.use_gpu,
             "nodes": topology.num_nodes, "strategy": cfg.scaling.placement_strategy}
    return key_fields({**shape, **step_numerics(cfg)}, ranks, cluster_nodes())


def step_numerics(cfg: Any) -> Dict[str, Any]:
    """What the plan probe's step times beyond the shape: its precision, the tables' dtype and the exchanges'
    wire precision (``train.comm_precision``: a 16-bit exchange moves half the bytes). fp32 exchanges, the
    default, are left out, so that measurements kept before the key existed still match the jobs they fit."""
    numerics = {"precision": cfg.train.precision, "embedding_dtype": cfg.model.embedding_dtype}
    comm = dict(cfg.train.comm_precision)
    if any(v != "fp32" for v in comm.values()):
        numerics["comm_precision"] = comm
    return numerics


def kept_max_age_s(cfg: Any) -> float:
    """How old a kept measurement may be for this job (0 with ``planner.recalibrate``: measure anew)."""
    return 0.0 if cfg.planner.recalibrate else 3600.0 * cfg.planner.calibration_max_age_h


def job_hardware(inputs: Any, resources: Any) -> Dict[str, Any]:
    """The ranks' :func:`~rayemb.train.calibration.calibrate.hardware_key`: on a one-node cluster this driver's host is theirs
    (nothing to start), else measured by ranks placed like the Train workers
    (:func:`~rayemb.train.calibration.calibrate.link_fingerprint`)."""
    import ray

    from rayemb.train.calibration.calibrate import cpu_model, hardware_key, link_fingerprint

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) == 1 and alive[0].get("NodeID") == ray.get_runtime_context().get_node_id():
        return hardware_key({"all_to_all_mb_s": None, "cpus": [cpu_model()]})
    cfg = inputs.cfg
    return link_fingerprint(inputs.world_size, resources.cpus_per_worker, cfg.scaling.use_gpu,
                            cfg.scaling.placement_strategy)


def skipped_because(cfg: Any, schema: Any, world_size: int) -> Optional[str]:
    """Why the job runs no full calibration nor plan probe (None: it runs them), in the words of the driver's plan
    line (with every table pinned its links are still measured: :func:`calibrate`)."""
    from rayemb.train.sharding import placement_choice

    if cfg.planner.objective != "step_time":
        return f"planner.objective is {cfg.planner.objective}"
    if not cfg.planner.calibrate:
        return "planner.calibrate is off"
    no_choice = placement_choice(cfg, schema.sparse_names, world_size, schema.raw_names)
    if no_choice == "every table pinned":
        return "every table is pinned"
    return no_choice


def calibrate(inputs: Any, topology: Any, resources: Any) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """The step-time model's constants for the job (None: not asked for, one rank, or failed): a stored
    calibration of the same key when recent enough, else measured on the live cluster and stored; and that key's
    fields (:func:`job_key_fields` with the ``hardware``, for the plan probe's kept result; None without a
    calibration). A job with every table pinned has nothing to choose: it reuses a kept calibration of its shape,
    else measures only its links (:func:`_measure_link`, source ``link-measured``), for its prediction."""
    from rayemb.logs import redact_uri
    from rayemb.train.sharding import placement_choice

    cfg = inputs.cfg
    if cfg.planner.objective != "step_time" or not cfg.planner.calibrate:
        return None, None
    no_choice = placement_choice(cfg, inputs.schema.sparse_names, inputs.world_size, inputs.schema.raw_names)
    if no_choice is not None and no_choice != "every table pinned":
        print(f"rayemb: {no_choice}: no placement to choose, no calibration nor plan probe; the step time is "
              "predicted with the built-in constants", flush=True)
        return None, None
    from rayemb.train.calibration.calibrate import calibrate_and_fingerprint, job_shape

    shape = job_shape(cfg, inputs.schema, inputs.model)
    fields = job_key_fields(inputs, topology, resources, shape)
    max_age_s = kept_max_age_s(cfg)
    hardware = None
    if max_age_s > 0 and any_kept(inputs.out_dir, fields):  # else nothing to look up: the calibration brings it
        try:
            hardware = job_hardware(inputs, resources)
        except Exception as e:  # noqa: BLE001 - without the hardware nothing kept can be trusted: measure
            print(f"rayemb: WARNING: could not fingerprint the ranks' link ({type(e).__name__}: {e}); calibrating",
                  flush=True)
        kept = None if hardware is None else load_calibration(inputs.out_dir, {**fields, "hardware": hardware},
                                                              max_age_s)
        if kept is not None:
            cal, age, path = kept
            print(f"rayemb: calibration of this shape and hardware ({hardware['link']}) from {redact_uri(path)}, "
                  f"measured {age / 3600:.1f} h ago (planner.recalibrate=true measures anew): {cal.summary()}",
                  flush=True)
            return cal, {**fields, "hardware": hardware}
    if no_choice is not None:
        return _measure_link(inputs, topology, resources, fields, hardware, no_choice)
    print(f"rayemb: calibrating the step-time model on {inputs.world_size} ranks ...", flush=True)
    try:
        cal, measured_hardware = calibrate_and_fingerprint(
            inputs.world_size, resources.cpus_per_worker, cfg.scaling.use_gpu, topology.num_nodes, shape,
            strategy=cfg.scaling.placement_strategy)
    except Exception as e:  # noqa: BLE001 - planning goes on with the defaults, said loudly
        print(f"rayemb: WARNING: calibration failed ({type(e).__name__}: {e}); planning with the built-in "
              "constants (planner.calibrate=false skips it)", flush=True)
        return None, None
    print(f"rayemb: calibrated in {cal.seconds:.1f}s: {cal.summary()}", flush=True)
    # the fingerprint looked up with, when there was one: the next job of this hardware measures the same
    fields = {**fields, "hardware": hardware or measured_hardware}
    try:
        store_calibration(inputs.out_dir, fields, cal)
    except Exception as e:  # noqa: BLE001 - the job goes on; the next one measures again
        print(f"rayemb: WARNING: could not keep the calibration for later jobs ({type(e).__name__}: {e})", flush=True)
    return cal, fields


def _measure_link(inputs: Any, topology: Any, resources: Any, fields: Dict[str, Any],
                  hardware: Optional[Dict[str, Any]], no_choice: str) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """A job with nothing to choose and no kept calibration of its shape: its links measured on its ranks
    (:func:`~rayemb.train.calibration.calibrate.measure_link`), the compute figures built in, never kept as a
    calibration (a job that chooses measures the rest)."""
    from rayemb.train.calibration.calibrate import measure_link

    cfg = inputs.cfg
    print(f"rayemb: {no_choice}: no placement to choose, no calibration nor plan probe; measuring the link on "
          f"{inputs.world_size} ranks for the prediction ...", flush=True)
    try:
        cal, measured_hardware = measure_link(inputs.world_size, resources.cpus_per_worker, cfg.scaling.use_gpu,
                                              topology.num_nodes, strategy=cfg.scaling.placement_strategy)
    except Exception as e:  # noqa: BLE001 - the pins stand; the prediction falls back to the built-in constants
        print(f"rayemb: WARNING: link measurement failed ({type(e).__name__}: {e}); predicting with the built-in "
              "constants", flush=True)
        return None, None
    print(f"rayemb: link measured in {cal.seconds:.1f}s: {cal.summary()} (compute figures built in)", flush=True)
    return cal, {**fields, "hardware": hardware or measured_hardware}


__all__ = ["calibrate", "skipped_because", "with_learned_ratio", "learn_ratio", "load_ratios", "load_learned",
           "fit_family_ratios", "ratio_file", "key_fields", "job_key_fields", "job_hardware", "kept_max_age_s", "load_kept", "store_kept",
           "cache_key", "cache_path", "any_kept", "check_calibration", "load_calibration", "store_calibration",
           "cluster_nodes", "CACHE_DIR"]
