"""What the plan probe changes in plan.json, and when it steps its candidates together (no Ray: the job planned
on this host, the probe's outcome applied to the precomputed candidates)."""

from __future__ import annotations

import copy

import pytest

from rayemb.config import load_config
from rayemb.train.calibration.plan_probe import ProbeResult, apply_probe, choose_by_probe, fit_together, other_side, \
    probe_candidates, rank_bytes


@pytest.fixture(scope="module")
def job(tiny_data):
    """A 2-rank job on tiny_data (statistics counted exactly, in this process): its config, schema, statistics,
    split, ``plan_for`` and the probe's candidates (the model's plan, then the other side of the hybrid choice)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayemb.data.schema import load_checked, parquet_files
    from rayemb.data.stats import _summarize_table
    from rayemb.data.stats_types import DatasetStats
    from rayemb.planner.tables import split_rule
    from rayemb.planner.types import ClusterTopology
    from rayemb.train.sharding import make_job_plan

    schema = load_checked(tiny_data)
    table = pa.concat_tables(pq.read_table(f) for f in parquet_files(tiny_data))
    features = [(f.name, int(f.num_embeddings), bool(f.multi_hot)) for f in schema.sparse]
    stats = DatasetStats(rows=table.num_rows, exact=True,
                         tables={n: s.to_stats() for n, s in _summarize_table(table, features, None).items()})
    cfg = load_config("jobs/configs/synth_small.yaml", [f"data.path={tiny_data}", "data.batch_size=256",
                                                        "scaling.num_workers=2", "planner.probe_steps=4"])
    topology = ClusterTopology(1, 2, compute_device="cpu")
    split = split_rule(topology, 512, cfg.model.embedding_dim).split(stats)

    def plan_for(c):
        return make_job_plan(c, schema, stats, split, topology)

    candidates = probe_candidates(cfg, plan_for(cfg), split, plan_for)
    return dict(cfg=cfg, schema=schema, stats=stats, split=split, plan_for=plan_for, candidates=candidates)


@pytest.mark.parametrize("chosen", [0, 1])
def test_predicted_step_time_is_the_models_with_or_without_the_probe(job, chosen):
    cfg, split, plan_for = job["cfg"], job["split"], job["plan_for"]
    no_probe = load_config("jobs/configs/synth_small.yaml", [f"data.path={cfg.data.path}", "data.batch_size=256",
                                                             "scaling.num_workers=2", "planner.probe_steps=0"])
    model_alone = choose_by_probe(no_probe, job["schema"], plan_for(no_probe), job["stats"], split, plan_for,
                                  world=2, cpus_per_worker=1)
    assert "probed_step_time_s" not in model_alone.summary and "plan_probe" not in model_alone.summary

    candidates = copy.deepcopy(job["candidates"])
    assert len(candidates) == 2
    model = [c.summary["predicted_step_time_s"] for c in candidates]
    assert model[0] == model_alone.summary["predicted_step_time_s"]
    probed = [0.030, 0.020] if chosen else [0.020, 0.030]
    trained = apply_probe(candidates, ProbeResult(probed, chosen, seconds=1.5, interleaved=False))
    assert trained is candidates[chosen]
    # the plan that trains keeps the model's own figure for it, as planned before any probe; the probe's apart
    replanned = plan_for(cfg if chosen == 0 else other_side(cfg, candidates[0], split))
    assert trained.summary["predicted_step_time_s"] == model[chosen] == replanned.summary["predicted_step_time_s"]
    assert trained.summary["probed_step_time_s"] == 0.020 != trained.summary["predicted_step_time_s"]
    assert "model_predicted_step_time_s" not in trained.summary
    record = trained.summary["plan_probe"]
    assert record["chosen"] == chosen and record["schedule"] == "sequential"
    assert [c["predicted_step_time_s"] for c in record["candidates"]] == model
    assert [c["probed_step_time_s"] for c in record["candidates"]] == probed


def test_candidates_interleave_only_when_they_fit_a_rank_together(job):
    dim = job["cfg"].model.embedding_dim
    for c in job["candidates"]:
        tables = c.summary["tables"]
        per_rank = rank_bytes(c.summary)
        assert len(per_rank) == 2 and sum(per_rank) == sum(t["memory_bytes"] for t in tables.values())
        for name, t in tables.items():  # rows x dim x 4 bytes plus the optimizer's state, replicas on each rank
            rows = job["schema"].feature(name).num_embeddings
            if t["placement"] == "row_wise":
                assert t["memory_bytes"] == rows * (dim * 4 + 4)  # row-wise Adagrad: one float a row
            elif t["placement"] == "data_parallel":
                assert t["memory_bytes"] == 2 * rows * (dim * 4 + 4)  # replicated rows' row-wise Adagrad too
    both = [rank_bytes(c.summary)[0] for c in job["candidates"]]
    assert fit_together(both, sum(both)) and fit_together(both, 10 * sum(both))
    assert not fit_together(both, sum(both) - 1)  # each fits alone: stepped one after another, none dropped
    assert fit_together(both[:1], sum(both) - 1) and fit_together(both[1:], sum(both) - 1)


def test_a_plan_json_of_the_previous_schema_is_refused_by_name():
    from rayemb.errors import PlanError
    from rayemb.planner.types import PLAN_SCHEMA_VERSION, PlanResult

    assert PLAN_SCHEMA_VERSION == 2
    with pytest.raises(PlanError) as e:
        PlanResult.from_json({"schema_version": 1, "world_size": 2, "tables": {}, "ranks": []}, source="old.json")
    assert e.value.category == "invalid_plan_file"
    assert "old.json" in str(e.value) and "schema_version 1" in str(e.value) and "rayemb plan" in str(e.value)


def test_no_calibration_or_probe_where_there_is_no_placement_to_choose():
    from rayemb.train.sharding import placement_choice

    tables = ["C1", "C2"]
    cfg = load_config("jobs/configs/synth_small.yaml", ["scaling.num_workers=2"])
    assert placement_choice(cfg, tables, 1) == "one rank"
    assert placement_choice(cfg, tables, 2) is None
    pinned = load_config("jobs/configs/synth_small.yaml", [
        "scaling.num_workers=2", "planner.tables.C1.sharding=row_wise", "planner.tables.C2.sharding=data_parallel"])
    assert placement_choice(pinned, tables, 2) == "every table pinned"
    # a table left free, or pinned hybrid (its hot set still follows the calibration), leaves a choice
    assert placement_choice(pinned, tables + ["C3"], 2) is None
    hybrid = load_config("jobs/configs/synth_small.yaml", [
        "scaling.num_workers=2", "planner.tables.C1.sharding=row_wise", "planner.tables.C2.sharding=hybrid"])
    assert placement_choice(hybrid, tables, 2) is None
