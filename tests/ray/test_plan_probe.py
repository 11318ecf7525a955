"""The plan probe on a real local Ray: the job's own sharded model on 2 gloo rank actors, candidates timed."""

import pytest

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _plan(cfg, schema, stats, split, topology):
    from rayemb.train.sharding import make_job_plan

    return make_job_plan(cfg, schema, stats, split, topology)


def test_probe_times_each_candidate_on_rank_actors_and_picks_the_faster(ray_2_cpus, tiny_data):
    import ray

    from rayemb.data.schema import load_checked
    from rayemb.data.stats import compute_stats
    from rayemb.planner.tables import split_rule
    from rayemb.planner.types import ClusterTopology
    from rayemb.train.calibration.plan_probe import placement_counts, probe_plans, rank_bytes, table_samples

    overrides = [f"data.path={tiny_data}", "data.batch_size=256", "scaling.num_workers=2", "planner.probe_steps=4"]
    cfg = load_config("jobs/configs/synth_small.yaml", overrides)
    schema = load_checked(tiny_data)
    stats = compute_stats(tiny_data)
    topology = ClusterTopology(1, 2, compute_device="cpu")
    split = split_rule(topology, 512, cfg.model.embedding_dim).split(stats)
    hybrid_cfg = load_config("jobs/configs/synth_small.yaml", overrides + [
        f"planner.tables.{t}.hybrid=true" for t in schema.sparse_names])
    pooled_cfg = load_config("jobs/configs/synth_small.yaml", overrides + ["planner.hybrid=false"])
    plans = [_plan(hybrid_cfg, schema, stats, split, topology), _plan(pooled_cfg, schema, stats, split, topology)]
    assert "hybrid" in placement_counts(plans[0].summary) and "hybrid" not in placement_counts(plans[1].summary)

    before = ray.available_resources().get("CPU")
    result = probe_plans(cfg, schema, plans, table_samples(schema, stats, split), world=2, cpus_per_worker=0.5,
                         use_gpu=False)
    # both candidates were stepped (a step costs time), together (tiny tables), and the faster one is chosen,
    # unless the two read within the probe's own noise (its rounds' scatter): then the model's plan, candidate 0
    assert len(result.step_s) == 2 and all(0 < s < 5 for s in result.step_s) and result.interleaved
    assert result.noise_s is not None and result.noise_s[0] == 0.0 and 0 <= result.noise_s[1] < 5
    within = abs(result.step_s[1] - result.step_s[0]) <= result.noise_s[1]
    assert result.within_noise == within
    assert result.chosen == (0 if within else min(range(2), key=result.step_s.__getitem__))
    record = result.to_dict(plans)
    assert record["chosen"] == result.chosen and record["seconds"] > 0 and record["within_noise"] == within
    assert [c["placements"] for c in record["candidates"]] == [placement_counts(p.summary) for p in plans]
    assert [c["probed_step_time_s"] for c in record["candidates"]] == result.step_s
    assert [c["predicted_step_time_s"] for c in record["candidates"]] == [
        p.summary["predicted_step_time_s"] for p in plans]
    # when the two do not fit a rank's memory together, each is stepped alone, one after the other: none dropped
    alone = max(rank_bytes(p.summary)[r] for p in plans for r in range(2))
    apart = probe_plans(cfg, schema, plans, table_samples(schema, stats, split), world=2, cpus_per_worker=0.5,
                        use_gpu=False, budget_cap=alone)
    assert not apart.interleaved and apart.to_dict(plans)["schedule"] == "sequential"
    assert len(apart.step_s) == 2 and all(0 < s < 5 for s in apart.step_s)
    # the rank actors and their placement group are gone: the job's workers get every CPU back
    for _ in range(50):
        if ray.available_resources().get("CPU") == before:
            break
        import time

        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == before


def test_the_same_candidates_on_the_same_key_are_not_probed_again(ray_2_cpus, tiny_data, tmp_path, capsys):
    from rayemb.data.schema import load_checked
    from rayemb.data.stats import compute_stats
    from rayemb.planner.tables import split_rule
    from rayemb.planner.types import ClusterTopology
    from rayemb.train.calibration.plan_probe import choose_by_probe

    cfg = load_config("jobs/configs/synth_small.yaml", [f"data.path={tiny_data}", "data.batch_size=256",
                                                        "scaling.num_workers=2", "planner.probe_steps=4"])
    schema, stats = load_checked(tiny_data), compute_stats(tiny_data)
    topology = ClusterTopology(1, 2, compute_device="cpu")
    split = split_rule(topology, 512, cfg.model.embedding_dim).split(stats)

    def plan_for(c, plan_split=None, topo=topology):
        return _plan(c, schema, stats, plan_split or split, topo)

    kept = (str(tmp_path / "runs"), {"a job's key fields": 1}, 3600.0)
    first = choose_by_probe(cfg, schema, plan_for(cfg), stats, split, plan_for, 2, 0.5, kept=kept)
    assert "probing 2 plan(s)" in capsys.readouterr().out
    second = choose_by_probe(cfg, schema, plan_for(cfg), stats, split, plan_for, 2, 0.5, kept=kept)
    out = capsys.readouterr().out
    assert "probing" not in out and "plan probe of these 2 plan(s) from" in out
    mark = ("source", "age_s", "seconds")  # where the figures come from, apart from the figures
    assert {k: v for k, v in second.summary["plan_probe"].items() if k not in mark} == \
        {k: v for k, v in first.summary["plan_probe"].items() if k not in mark}
    assert first.summary["plan_probe"]["source"] == "measured" and first.summary["plan_probe"]["age_s"] == 0
    assert second.summary["plan_probe"]["source"] == "cached" and second.summary["plan_probe"]["age_s"] > 0
    assert second.summary["probed_step_time_s"] == first.summary["probed_step_time_s"]
    # another key (or an age limit of 0: planner.recalibrate) probes again
    choose_by_probe(cfg, schema, plan_for(cfg), stats, split, plan_for, 2, 0.5, kept=(kept[0], kept[1], 0.0))
    assert "probing 2 plan(s)" in capsys.readouterr().out
