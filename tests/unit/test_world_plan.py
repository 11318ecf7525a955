"""``rayemb plan`` takes its hot set from :func:`rayemb.train.world_plan.plan_world`, as a job does for each of
its world sizes (tests/ray/test_plan_stage_worlds.py): on several nodes it shows the split plan_world gives, and
the planner's table specs take a split, never make one of their own.

HugeCTR's split runs as it is, wrapped to record who calls it for which world.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from _split_calls import split_calls  # noqa: F401 - a fixture
from rayemb.batch_shape import BatchShape
from rayemb.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")


@pytest.mark.timeout(300)
def test_rayemb_plan_on_several_nodes_shows_the_hot_set_of_plan_world(tiny_data, tmp_path, monkeypatch, split_calls):
    import rayemb.train.world_plan as world_plan
    from rayemb.cli.plan import add_plan_arguments, plan_main
    from rayemb.data.stats import compute_stats
    from rayemb.data.stats_io import write_stats_json
    from rayemb.planner.topology import described_topology

    stats = compute_stats(tiny_data)
    stats_path = write_stats_json(stats, str(tmp_path / "stats.json"))
    cfg = load_config(CONFIG, [f"data.path={tiny_data}"])
    two_nodes = described_topology(4, 2, compute_device="cpu", ddr_gib=8)
    hot = {t for t, s in world_plan.plan_world(cfg, two_nodes, stats).split.tables.items() if s.num_hot}
    assert hot, "no table has a hot set on this topology: nothing to show"
    (tmp_path / "pins.yaml").write_text(yaml.safe_dump({t: {"sharding": "hybrid"} for t in hot}))
    made = []

    def recorded(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    real = world_plan.plan_world
    monkeypatch.setattr(world_plan, "plan_world", recorded)
    split_calls.clear()
    out = tmp_path / "plan.json"
    args = add_plan_arguments(argparse.ArgumentParser()).parse_args([
        "--config", CONFIG, "--set", f"data.path={tiny_data}", "--stats", stats_path, "--world-size", "4",
        "--gpus-per-node", "2", "--cpu", "--ddr-gib", "8", "--pins", str(tmp_path / "pins.yaml"),
        "--out", str(out)])
    assert plan_main(args) == 0

    assert len(made) == 1 and made[0].topology.num_nodes == 2 and made[0].batch == BatchShape(cfg.data.batch_size, 4)
    assert split_calls == [(4, 4 * cfg.data.batch_size, "plan_world")]  # the CLI's one split is plan_world's
    shown = {t: p["hot_rows"] for t, p in json.loads(out.read_text())["tables"].items() if p["hot_rows"]}
    assert shown == {t: s.num_hot for t, s in made[0].split.tables.items() if s.num_hot}


def test_tables_from_schema_needs_the_split_of_its_statistics(tiny_data):
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats import compute_stats
    from rayemb.planner.tables import tables_from_schema

    schema, stats = DatasetSchema.load(tiny_data), compute_stats(tiny_data)
    with pytest.raises(TypeError, match="split="):
        tables_from_schema(schema, 16, stats=stats)
    assert all(t.hot_rows == 0 and t.pooling_factor == 1.0 for t in tables_from_schema(schema, 16))
