"""How many trials a sweep runs at once where an autoscaler may grow the cluster."""

import sys

from rayemb.config import load_config
from rayemb.sweep.engine import cluster_capacity, default_concurrency, trial_count
from rayemb.sweep.space import parse_space

CONFIG = "jobs/configs/synth_small.yaml"


def test_capacity_is_what_the_autoscaler_may_grow_to_when_it_says():
    live = {"CPU": 2.0, "memory": 1e9, "node:127.0.0.1": 1.0}
    # a fixed cluster, or an autoscaler that publishes no limits (v1): the live nodes
    assert cluster_capacity(live, None) == {"CPU": 2.0, "GPU": 0.0}
    assert cluster_capacity(live, {}) == {"CPU": 2.0, "GPU": 0.0}
    # a head of 2 and up to 2 nodes of 2 CPUs
    assert cluster_capacity(live, {"CPU": 6, "memory": 0}) == {"CPU": 6.0, "GPU": 0.0}
    assert cluster_capacity({"CPU": 8.0, "GPU": 1.0}, {"CPU": 6, "GPU": 4}) == {"CPU": 8.0, "GPU": 4.0}

    one = load_config(CONFIG, ["scaling.num_workers=1", "scaling.cpus_per_worker=2"])
    assert default_concurrency([one], cluster_capacity(live)["CPU"]) == 1
    # two of the jobs fit in the 6 CPUs less the one kept for reads: the second waits for its node
    assert default_concurrency([one], cluster_capacity(live, {"CPU": 6})["CPU"]) == 2


def test_unbounded_autoscaler_runs_every_trial_at_once():
    dims = parse_space({"train.dense_lr": {"grid": [0.1, 0.01, 0.001]}, "train.weight_decay": {"uniform": [0, 1]}},
                       where="space")
    assert trial_count(dims, 2) == 6
    assert trial_count(parse_space({"train.dense_lr": {"loguniform": [0.001, 0.1]}}, where="space"), 4) == 4
    one = load_config(CONFIG, ["scaling.num_workers=1", "scaling.cpus_per_worker=2"])
    cpus = cluster_capacity({"CPU": 2.0}, {"CPU": sys.maxsize})["CPU"]
    assert default_concurrency([one], cpus, trials=trial_count(dims, 2)) == 6
    assert default_concurrency([one], 9.0, trials=6) == 4  # the cluster bounds it first
