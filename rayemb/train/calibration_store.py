"""The job's calibration (a driver stage): measured on the live cluster, or kept from an earlier job of the same
shape on the same cluster.

Measuring the step-time model's constants takes seconds to tens of seconds at every job start, and a job
resubmitted with another learning rate measures the same thing again. A calibration is stored under the
job's output storage (``tracking.output_dir``, local or a URI)::

    <output_dir>/calibrations/<key>.json    {"key_fields": {...}, "measured_at": <unix s>, "measured": {...}}

``key`` hashes everything the measurement depends on: the ranks (count, CPUs each, GPU or not, nodes,
placement strategy), the cluster's nodes (CPUs, GPUs and accelerator type of each), the job's local batch,
dense and sparse feature counts, dim, MLPs, input prefetch, the model (name and arguments) and the versions of
torch, fbgemm, TorchRec and rayemb. A stored calibration younger than ``planner.calibration_max_age_h`` is
used instead of measuring (plan.json's ``calibration.source`` says ``cached``, with its age);
``planner.recalibrate: true`` measures anew and replaces it. The plan probe's step times are kept the same way,
keyed also by its candidate plans (:func:`rayemb.train.plan_probe.choose_by_probe`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rayemb import storage

CACHE_DIR = "calibrations"


def _versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "rayemb"):
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


def key_fields(shape: Mapping[str, Any], ranks: Mapping[str, Any], nodes: List[Tuple[float, float, str]]) -> Dict[str, Any]:
    """What a calibration depends on (module docstring), as plain JSON values."""
    model = shape.get("model")
    schema = shape.get("schema")
    plain = {k: v for k, v in shape.items() if k not in ("model", "schema")}
    return {"shape": plain, "model": None if model is None else {"name": model.name, "args": dict(model.args)},
            "labels": None if schema is None else len(schema.labels), "ranks": dict(ranks),
            "nodes": [list(n) for n in nodes], "versions": _versions()}


def cache_key(fields: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(out_dir: str, key: str) -> str:
    return storage.join(out_dir, CACHE_DIR, f"{key}.json")


def load_kept(out_dir: str, fields: Mapping[str, Any], max_age_s: float,
              now: Optional[float] = None) -> Optional[Tuple[Dict[str, Any], float, str]]:
    """(the kept measurement, its age in seconds, where) of these ``fields`` when younger than ``max_age_s``, else
    None (also for an unreadable or foreign file: measuring is always the way out)."""
    if max_age_s <= 0:
        return None
    path = cache_path(out_dir, cache_key(fields))
    try:
        if not storage.exists(path):
            return None
        doc = json.loads(storage.read_text(path))
        if doc.get("key_fields") != json.loads(json.dumps(fields, sort_keys=True, default=str)):
            return None  # a hash collision or a hand-edited file
        age = (time.time() if now is None else now) - float(doc["measured_at"])
        if not 0 <= age <= max_age_s:
            return None
        return dict(doc["measured"]), age, path
    except Exception:  # noqa: BLE001 - a damaged entry is a miss, not a failed job
        return None


def store_kept(out_dir: str, fields: Mapping[str, Any], measured: Mapping[str, Any], now: Optional[float] = None) -> str:
    """Keeps ``measured`` (JSON values) as the measurement of ``fields``; returns where."""
    path = cache_path(out_dir, cache_key(fields))
    doc = {"key_fields": fields, "measured_at": time.time() if now is None else now, "measured": dict(measured)}
    storage.write_text(path, json.dumps(doc, sort_keys=True, indent=1, default=str))
    return path


def load_calibration(out_dir: str, fields: Mapping[str, Any], max_age_s: float,
                     now: Optional[float] = None) -> Optional[Tuple[Any, float, str]]:
    """(calibration, its age in seconds, where) kept for these ``fields`` (:func:`load_kept`), else None."""
    from rayemb.planner.step_time import Calibration

    kept = load_kept(out_dir, fields, max_age_s, now)
    if kept is None:
        return None
    try:
        cal = Calibration.from_dict(kept[0])
    except Exception:  # noqa: BLE001 - an entry of another layout is a miss
        return None
    return replace(cal, source="cached", seconds=0.0), kept[1], kept[2]


def store_calibration(out_dir: str, fields: Mapping[str, Any], cal: Any, now: Optional[float] = None) -> str:
    return store_kept(out_dir, fields, cal.to_dict(), now)


def job_key_fields(inputs: Any, topology: Any, resources: Any, shape: Mapping[str, Any]) -> Dict[str, Any]:
    """The key fields of the job's measurements (its calibration of ``shape``; with ``"probe"`` added, its plan
    probe, which times the job's own step: so the step's precision and the tables' dtype are in the key too)."""
    cfg = inputs.cfg
    ranks = {"world": inputs.world_size, "cpus_per_worker": resources.cpus_per_worker, "gpu": cfg.scaling.use_gpu,
             "nodes": topology.num_nodes, "strategy": cfg.scaling.placement_strategy}
    return key_fields({**shape, **step_numerics(cfg)}, ranks, cluster_nodes())


def step_numerics(cfg: Any) -> Dict[str, str]:
    """What the plan probe's step times beyond the shape: its precision and the tables' dtype."""
    return {"precision": cfg.train.precision, "embedding_dtype": cfg.model.embedding_dtype}


def kept_max_age_s(cfg: Any) -> float:
    """How old a kept measurement may be for this job (0 with ``planner.recalibrate``: measure anew)."""
    return 0.0 if cfg.planner.recalibrate else 3600.0 * cfg.planner.calibration_max_age_h


def calibrate(inputs: Any, topology: Any, resources: Any) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """The step-time model's constants for the job (None: not asked for, nothing to choose, or failed): a stored
    calibration of the same key when recent enough, else measured on the live cluster and stored; and that key's
    fields (:func:`job_key_fields`, for the plan probe's kept result; None without a calibration)."""
    from rayemb.logs import redact_uri
    from rayemb.train.sharding import placement_choice

    cfg = inputs.cfg
    if cfg.planner.objective != "step_time" or not cfg.planner.calibrate:
        return None, None
    if (no_choice := placement_choice(cfg, inputs.schema.sparse_names, inputs.world_size,
                                             inputs.schema.raw_names)) is not None:
        print(f"rayemb: {no_choice}: no placement to choose, no calibration nor plan probe; the step time is "
              "predicted with the built-in constants", flush=True)
        return None, None
    from rayemb.train.calibrate import calibrate_cluster, job_shape

    shape = job_shape(cfg, inputs.schema, inputs.model)
    fields = job_key_fields(inputs, topology, resources, shape)
    kept = load_calibration(inputs.out_dir, fields, kept_max_age_s(cfg))
    if kept is not None:
        cal, age, path = kept
        print(f"rayemb: calibration of this shape and cluster from {redact_uri(path)}, measured "
              f"{age / 3600:.1f} h ago (planner.recalibrate=true measures anew): {cal.summary()}", flush=True)
        return cal, fields
    print(f"rayemb: calibrating the step-time model on {inputs.world_size} ranks ...", flush=True)
    try:
        cal = calibrate_cluster(inputs.world_size, resources.cpus_per_worker, cfg.scaling.use_gpu,
                                topology.num_nodes, shape, strategy=cfg.scaling.placement_strategy)
    except Exception as e:  # noqa: BLE001 - planning goes on with the defaults, said loudly
        print(f"rayemb: WARNING: calibration failed ({type(e).__name__}: {e}); planning with the built-in "
              "constants (planner.calibrate=false skips it)", flush=True)
        return None, None
    print(f"rayemb: calibrated in {cal.seconds:.1f}s: {cal.summary()}", flush=True)
    try:
        store_calibration(inputs.out_dir, fields, cal)
    except Exception as e:  # noqa: BLE001 - the job goes on; the next one measures again
        print(f"rayemb: WARNING: could not keep the calibration for later jobs ({type(e).__name__}: {e})", flush=True)
    return cal, fields


__all__ = ["calibrate", "key_fields", "job_key_fields", "kept_max_age_s", "load_kept", "store_kept", "cache_key",
           "load_calibration", "store_calibration", "cluster_nodes", "CACHE_DIR"]
