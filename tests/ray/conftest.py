"""The one trained job that several modules read: training it again per module would only repeat minutes."""

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
    from rayemb.train.trainer import run_training

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
