"""The one trained job that several modules read: training it again per module would only repeat minutes."""

import pytest

from rayemb.config import load_config


@pytest.fixture(scope="package")
def e2e_job(shared_ray, tiny_data, tmp_path_factory):
    """A real job on the shared local Ray: 2 gloo workers, sharded DLRM, calibrated plan, MLflow sqlite store.

    Returns ``(output_dir, TrainResult)``. Its readers check the run (test_train_e2e) and export, register and
    serve its best checkpoint (test_export_predict); none of them changes what it trained.
    """
    from rayemb.train.trainer import run_training

    shared_ray.ensure()
    out = tmp_path_factory.mktemp("e2e")
    cfg = load_config(
        "jobs/configs/synth_small.yaml",
        [f"data.path={tiny_data}", f"tracking.output_dir={out}", "data.batch_size=256",
         "train.epochs=2", "train.log_every_n_steps=10", "tracking.experiment=e2e"],
    )
    return out, run_training(cfg)
