"""Compressed embedding tables (QR, block) vs plain: memory, step time and accuracy.

    python jobs/bench/compression.py --out bench-results/compression.json

Three parts, each on the real modules or the real job:

* **memory**: :class:`~rayemb.embedding.compressed.CompressedEmbeddingBagCollection`
  built with one plain, block (E_b) and QR (mult, m = ⌈√V⌉) table; the bytes are
  counted from the module's allocated parameters (``numel * element_size``; the
  tables and the block projection apart), not from the formula, and compared
  with :func:`rayemb.embedding.compression_math.compressed_bytes`. The reference
  size V = 1,048,576, D = 512, E_b = 128, fp32 is allocated for real (CPU);
  the largest Criteo-1TB tables (dim 128, E_b = 32) would take ~25 GB each
  plain, so they are built on the ``meta`` device (shapes without storage:
  ``"allocated": false`` in the JSON and ``meta`` in the table).
* **step time**: forward + backward (with the fused row-wise Adagrad update in
  backward, as the job trains) of each module sharded table-wise by
  ``DistributedModelParallel`` on one gloo rank, CPU, at ``--step-rows`` x
  ``--step-dim`` (default 1,048,576 x 128), ``--step-batch`` bags of
  ``--step-pooling`` ids; median (and min, max) of ``--step-iters`` steps after 3
  warm-up steps, the variants' steps interleaved in one process.
* **accuracy**: the default synthetic job (``--config``, default
  jobs/configs/synth_small.yaml) trained three times in one Ray cluster with the
  same seed, data and steps: plain, QR and block on the ``--tables`` largest
  tables (``planner.tables.<T>.compression``), every table pinned to
  ``--sharding`` (default table_wise, which QR and block tables allow) so that the
  plans differ only in the compression; valid AUC and logloss side by side.
  Acceptance: AUC within ``--auc-tolerance`` (0.01) of plain for QR and block.

``kernel: cached`` (FBGEMM's ``fused_uvm_caching``, a device cache in front of
host memory) needs CUDA: on CPU it is not measured (the JSON says so).

Writes ``{"schema_version": 1, "memory": [...], "step_time": [...], "auc": [...], "acceptance": {...},
"not_measured": [...]}``, a chart next to it (``.png``) and prints the tables. Quick check:
``--set train.epochs=1 --set train.max_steps_per_epoch=100 --step-iters 5``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import format_table, report, write_result  # noqa: E402

MiB = 2 ** 20
REFERENCE = {"rows": 1_048_576, "dim": 512, "block_dim": 128}
#: the largest Criteo-1TB tables are built on the meta device (plain: 45.8M x 128 fp32 = 23.4 GB each)
CRITEO_TABLES = 3
CRITEO_DIM = 128
VARIANTS = ("plain", "block", "qr")

MEM_COLUMNS = [("table", "<16", "{}"), ("rows", ">11", "{:,}"), ("dim", ">4", "{}"), ("variant", "<6", "{}"),
               ("device", "<5", "{}"), ("table MiB", ">10", "{:,.2f}"), ("proj MiB", ">9", "{:.3f}"),
               ("formula MiB", ">11", "{:,.2f}"), ("ratio", ">8", "{:,.1f}")]
MEM_KEYS = ["table", "rows", "dim", "variant", "device", "table_mib", "projection_mib", "formula_mib", "ratio"]
STEP_COLUMNS = [("variant", "<6", "{}"), ("rows", ">10", "{:,}"), ("dim", ">4", "{}"), ("batch", ">6", "{}"),
                ("fwd+bwd ms", ">10", "{:.2f}"), ("min ms", ">7", "{:.2f}"), ("max ms", ">7", "{:.2f}")]
STEP_KEYS = ["variant", "rows", "dim", "batch", "median_ms", "min_ms", "max_ms"]
AUC_COLUMNS = [("variant", "<6", "{}"), ("tables", "<28", "{}"), ("valid_auc", ">9", "{:.4f}"),
               ("vs plain", ">9", "{:+.4f}"), ("logloss", ">8", "{:.4f}"), ("steps", ">6", "{}"),
               ("wall s", ">7", "{:.0f}"), ("table MiB", ">9", "{:.2f}")]
AUC_KEYS = ["variant", "tables_str", "valid_auc", "auc_vs_plain", "valid_logloss", "steps", "wall_time_s",
            "embedding_mib"]


def spec_of(variant: str, dim: int, block_dim: Optional[int] = None):
    from rayemb.embedding.compression_math import CompressionSpec

    if variant == "block":
        return CompressionSpec("block", block_dim=block_dim or max(1, dim // 4))
    if variant == "qr":
        return CompressionSpec("qr", combine="mult")
    return CompressionSpec()


def module_bytes(rows: int, dim: int, variant: str, block_dim: Optional[int], device: str) -> Dict[str, Any]:
    """Builds the real module and counts its parameters' bytes: tables (TorchRec / replicated rows) and projection."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection
    from rayemb.embedding.compression_math import compressed_bytes, projection_bytes

    spec = spec_of(variant, dim, block_dim)
    cfg = EmbeddingBagConfig(name="t", embedding_dim=dim, num_embeddings=rows, feature_names=["f"])
    t0 = time.monotonic()
    m = CompressedEmbeddingBagCollection([cfg], {"t": spec}, device=torch.device(device))
    build_s = time.monotonic() - t0
    proj = sum(p.numel() * p.element_size() for n, p in m.named_parameters() if n.startswith("projections."))
    tables = sum(p.numel() * p.element_size() for n, p in m.named_parameters() if not n.startswith("projections."))
    shapes = {n: list(p.shape) for n, p in m.named_parameters()}
    allocated = all(p.device.type != "meta" for p in m.parameters())
    del m
    formula = compressed_bytes(rows, dim, spec) + projection_bytes(dim, spec)
    plain = rows * dim * 4
    return {"rows": rows, "dim": dim, "variant": variant, "block_dim": spec.block_dim, "device": device,
            "allocated": allocated, "table_bytes": tables, "projection_bytes": proj, "table_mib": tables / MiB,
            "projection_mib": proj / MiB, "formula_mib": formula / MiB, "ratio": plain / (tables + proj),
            "shapes": shapes, "build_s": build_s}


def memory_rows() -> List[Dict[str, Any]]:
    from rayemb.constants import CRITEO_1TB_CARDINALITIES

    out = []
    for v in VARIANTS:
        out.append({"table": "reference", **module_bytes(REFERENCE["rows"], REFERENCE["dim"], v,
                                                         REFERENCE["block_dim"], "cpu")})
    largest = sorted(enumerate(CRITEO_1TB_CARDINALITIES), key=lambda x: -x[1])[:CRITEO_TABLES]
    for i, rows in largest:
        for v in VARIANTS:
            out.append({"table": f"criteo1tb C{i + 1}", **module_bytes(rows, CRITEO_DIM, v, CRITEO_DIM // 4, "meta")})
    return out


def memory_acceptance(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    ref = {r["variant"]: r for r in rows if r["table"] == "reference"}
    plain_mib, block_mib = ref["plain"]["table_mib"], ref["block"]["table_mib"]
    qr_mib = ref["qr"]["table_mib"] + ref["qr"]["projection_mib"]
    return {"plain_mib": plain_mib, "block_table_mib": block_mib, "qr_mib": qr_mib,
            "pass": plain_mib == 2048 and block_mib == 512 and qr_mib <= 8}


# ---- step time: DMP on one gloo rank, fused row-wise Adagrad in backward ---- #


def _step_rank(rank: int, world_size: int, variants: Sequence[str], rows: int, dim: int, batch: int, pooling: int,
               iters: int) -> List[Dict[str, Any]]:
    """All variants in one process, their steps interleaved (plain, block, qr, plain, ...) so that a change in
    the machine's load touches them alike; the same ids for every variant in each round."""
    import numpy as np
    import torch
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.embedding.compressed import compressed_from_placements
    from rayemb.embedding.sharders import cpu_capable_sharders

    torch.manual_seed(0)
    sharders = cpu_capable_sharders()
    models = {}
    for v in variants:
        cfg = EmbeddingBagConfig(name="t", embedding_dim=dim, num_embeddings=rows, feature_names=["f"])
        module, cons = compressed_from_placements([cfg], {"t": spec_of(v, dim)}, {"t": "table_wise"},
                                                  device=torch.device("meta"))
        apply_optimizer_in_backward(RowWiseAdagrad, module.table_parameters(), {"lr": 0.01})
        plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                        constraints=cons).plan(module, sharders)
        models[v] = DistributedModelParallel(module, device=torch.device("cpu"), plan=plan, sharders=sharders)
    rng = np.random.default_rng(0)
    times: Dict[str, List[float]] = {v: [] for v in variants}
    for i in range(iters + 3):
        lengths = torch.full((batch,), pooling, dtype=torch.int64)
        ids = torch.from_numpy(rng.integers(0, rows, size=batch * pooling))
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=ids, lengths=lengths)
        for v in variants:
            t0 = time.perf_counter()
            models[v](kjt).values().sum().backward()
            if i >= 3:  # warm-up steps not counted
                times[v].append((time.perf_counter() - t0) * 1e3)
    return [{"variant": v, "rows": rows, "dim": dim, "batch": batch, "pooling": pooling, "iters": iters,
             "median_ms": statistics.median(times[v]), "min_ms": min(times[v]), "max_ms": max(times[v]),
             "times_ms": times[v]} for v in variants]


def step_rows(rows: int, dim: int, batch: int, pooling: int, iters: int) -> List[Dict[str, Any]]:
    from rayemb.multiprocess import run_multiprocess

    return run_multiprocess(_step_rank, 1, variants=list(VARIANTS), rows=rows, dim=dim, batch=batch,
                            pooling=pooling, iters=iters, threads_per_rank=2)[0]


# ---- accuracy: the real job, plain vs QR vs block ---- #


def largest_tables(data_path: str, n: int) -> Tuple[List[str], List[str]]:
    """The ``n`` largest tables of the dataset, largest first, then every table."""
    from rayemb.data.schema import DatasetSchema

    schema = DatasetSchema.load(data_path)
    return [f.name for f in sorted(schema.sparse, key=lambda f: -int(f.num_embeddings))[:n]], schema.sparse_names


def pins_for(variant: str, tables: Sequence[str], all_tables: Sequence[str], sharding: Optional[str]) -> List[str]:
    """``planner.tables`` of one setting: the compression of ``tables`` and, with ``sharding``, every table's
    sharding type (the same plan in every setting: only the compression differs)."""
    pins = {t: [f"sharding: {sharding}"] if sharding else [] for t in all_tables}
    if variant != "plain":
        for t in tables:
            pins[t].append(f"compression: {variant}")
    body = ", ".join(f"{t}: {{{', '.join(p)}}}" for t, p in pins.items() if p)
    return [f"planner.tables={{{body}}}"] if body else []


def auc_rows(config: str, overrides: Sequence[str], n_tables: int, seed: int, doc: Dict[str, Any],
             out: str, sharding: Optional[str]) -> List[Dict[str, Any]]:
    import ray

    from rayemb.config import load_config
    from rayemb.train.driver.trainer import run_training

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    base = load_config(config, list(overrides))
    from rayemb.config import resolve_path

    tables, all_tables = largest_tables(resolve_path(base.data.path), n_tables)
    rows: List[Dict[str, Any]] = []
    for variant in ("plain", "qr", "block"):
        print(f"accuracy: training {variant} ({' '.join(tables) if variant != 'plain' else 'no table'} compressed)",
              flush=True)
        cfg = load_config(config, [*overrides, *pins_for(variant, tables, all_tables, sharding), f"train.seed={seed}",
                                   f"tracking.run_name=compression-{variant}-seed{seed}"])
        r = run_training(cfg, new_run=True)  # each repeat is a run of its own
        storage = {t: v.get("storage") for t, v in r.plan["tables"].items() if v.get("storage")}
        emb = sum(v.get("storage", {}).get("device_memory_bytes", v.get("memory_bytes", 0))
                  for v in r.plan["tables"].values())
        placements: Dict[str, int] = {}
        for t in r.plan["tables"].values():
            placements[t["placement"]] = placements.get(t["placement"], 0) + 1
        rows.append({"variant": variant, "tables": [] if variant == "plain" else list(tables),
                     "placements": placements,
                     "tables_str": "-" if variant == "plain" else " ".join(tables), "status": r.status,
                     "valid_auc": r.metrics.get("valid_auc"), "valid_logloss": r.metrics.get("valid_logloss"),
                     "steps": int(r.metrics.get("step", 0)) or None, "wall_time_s": r.wall_time_s,
                     "storage": storage, "embedding_mib": emb / MiB, "run_id": r.run_id})
        doc["auc"] = rows
        write_result(out, doc)
    plain = rows[0]["valid_auc"]
    for r in rows:
        r["auc_vs_plain"] = None if plain is None or r["valid_auc"] is None else r["valid_auc"] - plain
    return rows


def plot(doc: Dict[str, Any], png: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # a chart never fails the benchmark
        print(f"compression: no chart ({e})")
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    mem = [r for r in doc.get("memory", []) if r["table"] == "reference"]
    if mem:
        axes[0].bar([r["variant"] for r in mem], [r["table_mib"] + r["projection_mib"] for r in mem],
                    color=["#888", "#4a7", "#47a"])
        axes[0].set_yscale("log")
        axes[0].set_title(f"memory, V={REFERENCE['rows']:,} D={REFERENCE['dim']} (MiB, log)")
    steps = doc.get("step_time", [])
    if steps:
        axes[1].bar([r["variant"] for r in steps], [r["median_ms"] for r in steps], color=["#888", "#4a7", "#47a"])
        axes[1].set_title(f"fwd+bwd ms (CPU, {steps[0]['rows']:,} x {steps[0]['dim']}, batch {steps[0]['batch']})")
    aucs = [r for r in doc.get("auc", []) if r.get("valid_auc") is not None]
    if aucs:
        axes[2].bar([r["variant"] for r in aucs], [r["valid_auc"] for r in aucs], color=["#888", "#47a", "#4a7"])
        lo = min(r["valid_auc"] for r in aucs)
        axes[2].set_ylim(max(0.5, lo - 0.03), min(1.0, max(r["valid_auc"] for r in aucs) + 0.01))
        axes[2].set_title("valid AUC, synthetic job")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="jobs/configs/synth_small.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job config overrides (accuracy)")
    p.add_argument("--tables", type=int, default=5, help="compress the N largest tables (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sharding", default="table_wise",
                   help="pin every table to this sharding type in all three runs, so that only the compression "
                        "differs ('' lets the planner choose per run; default %(default)s)")
    p.add_argument("--auc-tolerance", type=float, default=0.01)
    p.add_argument("--step-rows", type=int, default=1_048_576)
    p.add_argument("--step-dim", type=int, default=128)
    p.add_argument("--step-batch", type=int, default=2048)
    p.add_argument("--step-pooling", type=int, default=4)
    p.add_argument("--step-iters", type=int, default=20)
    p.add_argument("--skip", nargs="*", default=[], choices=["memory", "step", "auc"])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    doc: Dict[str, Any] = {"schema_version": 1, "config": args.config, "overrides": args.set, "seed": args.seed,
                           "not_measured": ["kernel: cached (FBGEMM fused_uvm_caching) needs CUDA; this run is CPU"]}
    if "memory" not in args.skip:
        doc["memory"] = memory_rows()
        doc["acceptance"] = {"memory": memory_acceptance(doc["memory"])}
        print(format_table(doc["memory"], MEM_COLUMNS, MEM_KEYS, title="memory (bytes of allocated parameters; "
                           "device meta: shapes only, numel x element_size)"), flush=True)
        write_result(args.out, doc)
    if "step" not in args.skip:
        doc["step_time"] = step_rows(args.step_rows, args.step_dim, args.step_batch, args.step_pooling,
                                     args.step_iters)
        print(format_table(doc["step_time"], STEP_COLUMNS, STEP_KEYS, title="\nforward + backward (fused "
                           "row-wise Adagrad), DMP table-wise on 1 gloo rank, CPU"), flush=True)
        write_result(args.out, doc)
    rows: List[Dict[str, Any]] = []
    if "auc" not in args.skip:
        doc["sharding_pin"] = args.sharding or None
        rows = auc_rows(args.config, args.set, args.tables, args.seed, doc, args.out, args.sharding or None)
        deltas = {r["variant"]: r["auc_vs_plain"] for r in rows if r["variant"] != "plain"}
        doc.setdefault("acceptance", {})["auc"] = {
            "tolerance": args.auc_tolerance, "delta_vs_plain": deltas,
            "pass": all(d is not None and abs(d) <= args.auc_tolerance for d in deltas.values())}
    doc["png"] = plot(doc, os.path.splitext(args.out)[0] + ".png")
    footer = f"acceptance: {doc.get('acceptance')}\nnot measured: {'; '.join(doc['not_measured'])}"
    return report(args.out, doc, rows, AUC_COLUMNS, AUC_KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
