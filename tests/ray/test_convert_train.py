"""Converted data trains as is: `rayemb convert` then `rayemb train` on a real local 2-CPU Ray, one job per format.

Criteo: the real 200-row sample in its tab-separated form. Avazu and MovieLens: thousands of rows
generated here with a seeded rng, each with a label that depends on its ids, so there is something to
learn. Each job runs one small epoch and must log a finite validation AUC to MLflow, scored on every
validation row. MovieLens trains with the config's own batch size, as `rayemb convert` tells a user to: its
leave-last-out split has fewer validation rows (one per user) than one global batch, as MovieLens-100K's
943 are.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from rayemb.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "criteo_sample.txt")
AVAZU_COLUMNS = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
                 "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")


def criteo_tsv(path):
    with open(FIXTURE) as f:
        rows = [line.rstrip("\n").split(",") for line in f][1:]
    with open(path, "w") as f:
        for r in rows:
            f.write("\t".join([r[0]] + [str(int(float(v))) if v else "" for v in r[1:14]] + r[14:]) + "\n")


def avazu_csv(path, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    cols = AVAZU_COLUMNS.split(",")
    site_logit = rng.normal(0, 1.5, size=30)
    app_logit = rng.normal(0, 1.5, size=20)
    with open(path, "w") as f:
        f.write(AVAZU_COLUMNS + "\n")
        for i in range(n):
            site, app = int(rng.integers(0, 30)), int(rng.integers(0, 20))
            p = 1 / (1 + math.exp(-(site_logit[site] + app_logit[app] - 1.0)))
            v = {c: f"{int(rng.integers(0, 50)):08x}" for c in cols[3:]}
            v.update(id=str(i), click=str(int(rng.random() < p)), hour=f"1410{21 + i % 10:02d}{i % 24:02d}",
                     site_id=f"s{site:07d}", app_id=f"a{app:07d}")
            f.write(",".join(v[c] for c in cols) + "\n")


def movielens_dat(path, users=301, items=150, per_user=60, seed=0):
    rng = np.random.default_rng(seed)
    quality = rng.normal(0, 1.2, size=items)
    with open(path, "w") as f:
        for u in range(1, users + 1):
            bias = rng.normal(0, 0.5)
            for k, m in enumerate(rng.choice(items, size=per_user, replace=False)):
                rating = int(np.clip(round(3 + quality[m] + bias + rng.normal(0, 0.5)), 1, 5))
                f.write(f"{u}::{m + 1}::{rating}::{1_000_000 + 100 * u + k}\n")


# format -> (writer of the raw file, its name, convert options, per-rank batch size; None: the config's 512,
# a global batch of 1,024 against MovieLens' 301 validation rows, an odd count that an equal split would cut)
CASES = {
    "criteo": (criteo_tsv, "train.txt", ["--hash-buckets", "500", "--valid-fraction", "0.3"], 16),
    "avazu": (avazu_csv, "train.csv", ["--vocab-from-train", "--valid-days", "30"], 64),
    "movielens": (movielens_dat, "ratings.dat", ["--history-length", "5"], None),
}


@pytest.mark.parametrize("fmt", list(CASES))
def test_converted_dataset_trains(ray_2_cpus, tmp_path, fmt):
    make, name, options, batch_size = CASES[fmt]
    raw = str(tmp_path / name)
    make(raw)
    data = str(tmp_path / "data")
    assert main(["convert", fmt, "--input", raw, "--out", data, *options]) == 0
    result_json = tmp_path / "result.json"
    rc = main(["train", "--config", os.path.join(REPO, "jobs", "configs", "synth_small.yaml"),
               "--set", f"data.path={data}", "--set", f"tracking.output_dir={tmp_path / 'runs'}",
               *(["--set", f"data.batch_size={batch_size}"] if batch_size else []),
               "--set", "train.epochs=1", "--set", "planner.calibrate=false",
               "--set", "model.embedding_dim=8", "--set", "model.bottom_mlp=[16,8]", "--set", "model.top_mlp=[16,1]",
               "--set", f"tracking.experiment=convert-{fmt}", "--set", "train.log_every_n_steps=5",
               "--result-json", str(result_json)])
    assert rc == 0
    result = json.loads(result_json.read_text())
    assert result["status"] == "FINISHED"
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs'}/mlflow.db")
    aucs = [m.value for m in client.get_metric_history(result["run_id"], "valid_auc")]
    assert len(aucs) == 1 and math.isfinite(aucs[0]) and 0.0 <= aucs[0] <= 1.0, aucs
    assert abs(result["metrics"]["valid_auc"] - aucs[0]) < 1e-9
    summary = json.loads(open(os.path.join(data, "convert_summary.json")).read())
    valid_rows = [m.value for m in client.get_metric_history(result["run_id"], "valid_rows")]
    assert valid_rows == [summary["rows"]["valid"]], (valid_rows, summary["rows"])  # every row, none padding
    params = client.get_run(result["run_id"]).data.params
    assert params["data.path"] == data and summary["bad_lines"]["total"] == 0
    if fmt != "criteo":  # thousands of rows with a label that depends on the ids: one epoch learns something
        assert aucs[0] > 0.6, aucs
