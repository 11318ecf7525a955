"""The two-tower model trains as a retrieval job: `rayemb convert movielens`, then `rayemb train` with
`model.name: two_tower` on a real local 2-CPU Ray, 2 ranks.

The ratings are generated here with structure a retrieval model can learn and popularity cannot: users
fall into groups, each rating mostly items of its group's own block, every item about as popular as any
other. The job must log hit rate@10/50/100 over the whole catalogue for every validation row, keep its
best epoch by hit rate@50, and rank held-out items far better than the most-popular list does.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from rayemb.cli import main
from tests._bench import load_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUPS, BLOCK, USERS, PER_USER = 4, 30, 160, 30


def grouped_ratings(path: str, seed: int = 0) -> None:
    """``ratings.dat``: user u of group u % GROUPS rates 90 % of its items from its group's block of items."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for u in range(USERS):
            block = (u % GROUPS) * BLOCK
            own = rng.choice(BLOCK, size=int(PER_USER * 0.9), replace=False) + block
            other = rng.choice(GROUPS * BLOCK, size=PER_USER - len(own), replace=False)
            for k, m in enumerate(rng.permutation(np.concatenate([own, other]))):
                f.write(f"{u + 1}::{m + 1}::{int(rng.integers(1, 6))}::{1_000_000 + 100 * u + k}\n")


def test_two_tower_job_learns_what_popularity_cannot(ray_2_cpus, tmp_path):
    raw, data = str(tmp_path / "ratings.dat"), str(tmp_path / "data")
    grouped_ratings(raw)
    assert main(["convert", "movielens", "--input", raw, "--out", data]) == 0
    result_json = tmp_path / "result.json"
    rc = main(["train", "--config", os.path.join(REPO, "jobs", "configs", "movielens_two_tower.yaml"),
               "--set", f"data.path={data}", "--set", f"tracking.output_dir={tmp_path / 'runs'}",
               "--set", "data.batch_size=64", "--set", "train.epochs=3", "--set", "planner.calibrate=false",
               "--set", "model.embedding_dim=8", "--set", "model.args.tower_mlp=[16,8]",
               "--set", "train.log_every_n_steps=10", "--result-json", str(result_json)])
    assert rc == 0
    result = json.loads(result_json.read_text())
    assert result["status"] == "FINISHED"
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs'}/mlflow.db")
    history = {k: [m.value for m in client.get_metric_history(result["run_id"], k)]
               for k in ("valid_hit_rate_at_10", "valid_hit_rate_at_50", "valid_hit_rate_at_100",
                         "best_valid_hit_rate_at_50", "valid_rows", "catalogue_items", "valid_auc")}
    summary = json.loads(open(os.path.join(data, "convert_summary.json")).read())
    assert history["valid_rows"] == [summary["rows"]["valid"]] * 3  # every held-out rating, every epoch
    assert history["catalogue_items"] == [GROUPS * BLOCK + 1] * 3  # every item id, the OOV one included
    assert history["valid_auc"] == []  # a retrieval job has no AUC to report
    for epoch in range(3):
        assert history["valid_hit_rate_at_10"][epoch] <= history["valid_hit_rate_at_50"][epoch] \
            <= history["valid_hit_rate_at_100"][epoch]
    assert history["best_valid_hit_rate_at_50"][-1] == max(history["valid_hit_rate_at_50"])
    # the job's wall time split into phases, logged once: steps and the workers' start measured by rank 0's clock
    phases = client.get_run(result["run_id"]).data.metrics
    assert 0 < phases["phase_s.steps"] < phases["phase_s.wall"] and phases["phase_s.workers"] > 0
    assert 0 < phases["phase_s.outside_steps_fraction"] < 1
    popular = load_bench("two_tower").popular_baseline(data)
    # popularity is flat here (about 1 in 12 held-out items in its top 10); the groups are learnt
    assert popular["hit_rate_at_10"] < 0.15, popular
    assert history["valid_hit_rate_at_10"][-1] > 2 * popular["hit_rate_at_10"], (history, popular)
