"""The trained jobs that several modules read: training them again per module would only repeat minutes."""

import pytest

from rayemb.config import load_config


@pytest.fixture(scope="package")
def e2e_job(shared_ray, tiny_data, tmp_path_factory):
    """A real job on the shared local Ray: 2 gloo workers, sharded DLRM, calibrated plan, MLflow sqlite store.

    A worker fails once, at step 100 (in the second epoch, after the first epoch's checkpoint), and the job
    must carry on: Ray Train restarts the group (``scaling.max_failures: 1``) and it resumes from that
    checkpoint. Returns ``(output_dir, TrainResult, fault marker file)``. Its readers check the run and the
    restart (test_train_e2e) and export, register and serve its best checkpoint (test_export_predict); none of
    them changes what it trained.
    """
    from rayemb.constants import FAULT_INJECTION_ENV_VAR
    from rayemb.train.driver.trainer import run_training

    shared_ray.ensure()
    out = tmp_path_factory.mktemp("e2e")
    marker = out / "fault-injected"
    # 36,000 train rows / (2 ranks x 256) = 70 steps per epoch
    cfg = load_config(
        "jobs/configs/synth_small.yaml",
        [f"data.path={tiny_data}", f"tracking.output_dir={out}", "data.batch_size=256",
         "train.epochs=2", "train.log_every_n_steps=10", "tracking.experiment=e2e", "scaling.max_failures=1"],
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULT_INJECTION_ENV_VAR, f"100:{marker}")
        return out, run_training(cfg), marker


#: the model of one's own that ``user_model_jobs`` trains (examples/deepfm.py: not an installed module)
USER_FACTORY = "examples.deepfm:deepfm"


@pytest.fixture(scope="package")
def user_model_jobs(shared_ray, tiny_data, tmp_path_factory):
    """DeepFM (``model.factory``) trained on 2 gloo ranks with a hybrid table (pinned, so the plan does not
    depend on the cost model), calibrated and probed on its own model, then resumed from its last checkpoint on
    3 ranks for a second epoch. Returns ``(first TrainResult, resumed TrainResult)``. Its readers check the
    training and the resume (test_user_model_job) and export the first job's best checkpoint
    (test_user_model_export); none of them changes what it trained."""
    from rayemb.train.driver.trainer import run_training

    shared_ray.ensure()
    out = tmp_path_factory.mktemp("user_model")
    common = [f"data.path={tiny_data}", f"tracking.output_dir={out}", "data.batch_size=256",
              f"model.factory={USER_FACTORY}", "model.args={hidden: [32, 16]}",
              "planner.tables={C1: {sharding: hybrid}}", "train.log_every_n_steps=10", "tracking.experiment=user"]
    # calibrated and probed: the calibration's dense step and the plan probe build DeepFM from its factory
    first = run_training(load_config("jobs/configs/synth_small.yaml", common + ["train.epochs=1"]))
    resumed = run_training(load_config("jobs/configs/synth_small.yaml", common + ["planner.calibrate=false",
        "train.epochs=2", "train.early_stopping_patience=null", f"train.resume_from={first.last_checkpoint}",
        "train.max_steps_per_epoch=20", "scaling.num_workers=3", "scaling.cpus_per_worker=0.5"]))
    return first, resumed
