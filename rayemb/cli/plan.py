"""``rayemb plan``: a sharding plan for the live or a described cluster, as plan.json, a PNG and tables."""

from __future__ import annotations

import argparse
import os

from rayemb.planner.planner import ENGINES, plan
from rayemb.planner.types import GiB


def add_plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``rayemb plan`` (then :func:`plan_main`)."""
    parser.add_argument("--config", required=True, help="job YAML (data.path, model.embedding_dim, data.batch_size)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set model.embedding_dim=64")
    parser.add_argument("--stats", help="stats.json from `rayemb stats` (pooling factors, hot sets)")
    parser.add_argument("--world-size", type=int, help="plan for a described cluster of N ranks (what-if)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="devices per node (default 8, cpu: 1)")
    parser.add_argument("--hbm-gib", type=float, help="GPU memory per device in GiB (a described cluster: default 80; "
                        "the live one: scaling.gpu_memory_gib, known from the GPU model where the cluster names it)")
    parser.add_argument("--ddr-gib", type=float, help="host memory per rank in GiB (default 128)")
    parser.add_argument("--cpu", action="store_true", help="described cluster without GPUs (tables in host memory)")
    parser.add_argument("--pins", help="YAML/JSON file {TABLE: {sharding: row_wise, hybrid: false, compute_kernel: fused}}; "
                        "compressed or cached: {compression: qr|block, kernel: cached, cache_load_factor: 0.1}")
    parser.add_argument("--engine", choices=ENGINES, default="auto", help="placement engine (default auto)")
    parser.add_argument("--out", required=True, help="plan.json to write (a PNG is written next to it)")
    return parser


def plan_main(args: argparse.Namespace) -> int:
    """``rayemb plan``: writes plan.json + plan.png, prints the tables. User errors raise RayembError subclasses."""
    import yaml

    from rayemb.config import load_config, resolve_path
    from rayemb.data.schema import DatasetSchema
    from rayemb.planner.report import plot_plan, save_plan_json, summary_table
    from rayemb.planner.tables import tables_from_schema
    from rayemb.planner.topology import described_topology
    from rayemb.publish import resolve_dataset
    from rayemb.train.world_plan import plan_world

    overrides = list(args.overrides)
    if args.hbm_gib and not args.world_size:  # the live cluster's plan: the job's GPU memory per device
        overrides.append(f"scaling.gpu_memory_gib={args.hbm_gib}")
    cfg = load_config(args.config, overrides)
    schema = DatasetSchema.load(resolve_dataset(resolve_path(cfg.data.path)))
    if args.world_size:
        topo = described_topology(
            args.world_size, args.gpus_per_node or (1 if args.cpu else 8), hbm_gib=args.hbm_gib,
            ddr_gib=args.ddr_gib, compute_device="cpu" if args.cpu else "cuda",
        )
    else:
        from rayemb._ray import init_ray

        init_ray()
        from rayemb.train.driver.trainer import job_topology

        topo = job_topology(cfg)  # the shape the config asks for (use_gpu, GPUs per node), on the live nodes
        if args.hbm_gib:
            topo = topo.with_overrides(hbm_bytes=int(args.hbm_gib * GiB))
    stats = None
    if args.stats:
        from rayemb.data.stats_io import load_stats_json

        stats = schema.table_stats(load_stats_json(args.stats))  # a shared table's: the union of its features'
    pins = None
    if args.pins:
        with open(args.pins) as f:
            pins = yaml.safe_load(f) or {}
    if schema.raw_names:  # raw-id tables are placed row-wise or hybrid (row-wise cold half), as a job places them
        from rayemb.train.sharding import raw_pin

        pins = {**(pins or {}), **{t: raw_pin(t, (pins or {}).get(t), cfg.planner.hybrid) for t in schema.raw_names}}
    # uncalibrated (HugeCTR's rule): across nodes a calibrated job's hot set comes from its measured break-even
    world = plan_world(cfg, topo, stats, table_dims=schema.table_dims(cfg.model.embedding_dim))
    tables = tables_from_schema(schema, cfg.model.embedding_dim, stats=stats, split=world.split,
                                bytes_per_element=cfg.model.embedding_bytes_per_element,
                                embedding_optimizer=cfg.train.embedding_optimizer)
    result = plan(tables, topo, world.batch.global_size, pins=pins, engine=args.engine)
    save_plan_json(result, args.out)
    png = plot_plan(result, os.path.splitext(args.out)[0] + ".png")
    print(summary_table(result))
    print(f"\nwrote {args.out} and {png}")
    return 0
