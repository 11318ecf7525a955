"""`rayemb train --sweep key=v1,v2` runs one real job per value (`rayemb sweep`'s engine, FIFO) as child runs of
one parent run."""

import pytest
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_sweep_makes_child_runs_under_one_parent(ray_2_cpus, tiny_data, tmp_path, capsys):
    from rayemb.cli import main

    rc = main(["train", "--config", "jobs/configs/synth_small.yaml",
               "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={tmp_path}",
               "--set", "tracking.experiment=sweep", "--set", "train.max_steps_per_epoch=2",
               "--set", "train.log_every_n_steps=2", "--set", "train.epochs=1", "--set", "planner.calibrate=false",
               "--set", "planner.probe_steps=0", "--set", "scaling.num_workers=1",
               "--sweep", "train.dense_lr=0.02,0.1"])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert out.count(" FINISHED valid_auc=") == 2, out[-3000:]  # one line per trial
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("sweep")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["train.dense_lr"] for c in children) == ["0.02", "0.1"]
    assert all(c.info.status == "FINISHED" for c in children) and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["sweep.scheduler"] == "fifo"
    assert parents[0].data.params["sweep.keys"] == "train.dense_lr"
    assert all("valid_auc" in c.data.metrics for c in children)
