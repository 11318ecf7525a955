"""A real job on a schema with a group column: GAUC per epoch, early stopping by it, windowed training metrics.

schema.yaml names ``group: user`` (an int64 user id column added to synthetic data). A 3-epoch job on the shared
local Ray (2 gloo workers) follows ``train.early_stopping_metric: valid_gauc``. Every epoch's checkpoint is
scored on the validation rows by the inference model built from it, and the group AUC of those scores, written
out in numpy group by group, is the ``valid_gauc`` the run logged at that checkpoint's step; the best epoch
and the best checkpoint are the epoch of the highest logged ``valid_gauc``. The run also logged the training log
window's NE and AUC at every log point.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EPOCHS, USERS = 3, 40


@pytest.fixture(scope="module")
def grouped_data(tmp_path_factory) -> str:
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = Path(tmp_path_factory.mktemp("grouped_data"))
    generate(SyntheticSpec(rows=6_000, num_tables=4, seed=3, num_signal_tables=3,
                           cardinalities=[120, 100, 80, 60]), str(out))
    rng = np.random.default_rng(0)
    for f in sorted(out.glob("*/*.parquet")):
        table = pq.read_table(f)
        users = rng.integers(0, USERS, size=table.num_rows).astype(np.int64)
        pq.write_table(table.append_column("user", pa.array(users)), f)
    path = out / "schema.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["group"] = "user"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(out)


def _gauc(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> float:
    """Rows-weighted mean over groups with both classes of the group's AUC (ties half), group by group."""
    total = weight = 0.0
    for g in np.unique(groups):
        y, s = labels[groups == g], scores[groups == g]
        pos, neg = s[y == 1], s[y == 0]
        if pos.size and neg.size:
            wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
            total += y.size * wins / (pos.size * neg.size)
            weight += y.size
    return total / weight


def _scores(checkpoint: str, cfg, schema, valid: pa.Table) -> np.ndarray:
    """The validation rows' logits from the inference model built from ``checkpoint``."""
    from rayemb.checkpoint.export import unsharded_state
    from rayemb.serve.model import InferenceModel, inference_state, model_config

    mcfg = model_config(cfg)
    model = InferenceModel.from_state(inference_state(unsharded_state(checkpoint), schema, mcfg), schema, mcfg,
                                      cfg.data.id_policy)
    return model.predict(valid)


def test_valid_gauc_per_epoch_is_the_checkpoints_and_picks_the_best_epoch(shared_ray, grouped_data, tmp_path):
    from rayemb.data.schema import DatasetSchema
    from rayemb.train.driver.trainer import run_training

    shared_ray.ensure()
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={grouped_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=128",
        f"train.epochs={EPOCHS}", "train.early_stopping_patience=null", "train.early_stopping_metric=valid_gauc",
        "train.log_every_n_steps=5", "train.keep_checkpoints=3", "planner.calibrate=false", "planner.probe_steps=0",
        # ~20 steps an epoch: no warm-up and Adagrad's rate, so the first epoch already ranks within groups
        "train.lr_schedule.warmup_steps=0", "train.dense_optimizer=adagrad", "train.dense_lr=0.05",
        "tracking.experiment=group-gauc"])
    result = run_training(cfg)
    assert result.status == "FINISHED"
    client = MlflowClient(result.tracking_uri)
    logged = {m.step: m.value for m in client.get_metric_history(result.run_id, "valid_gauc")}
    assert len(logged) == EPOCHS, logged

    schema = DatasetSchema.load(grouped_data)
    valid = pa.concat_tables([pq.read_table(f) for f in sorted(Path(grouped_data, "valid").glob("*.parquet"))])
    groups, labels = valid.column("user").to_numpy(), valid.column(schema.label).to_numpy()
    epochs = {}
    for meta_path in sorted(tmp_path.rglob("meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("epoch_complete"):
            epochs[int(meta["epoch"])] = (str(meta_path.parent), int(meta["step"]))
    assert sorted(epochs) == list(range(EPOCHS)), epochs
    for epoch, (checkpoint, step) in sorted(epochs.items()):
        want = _gauc(groups, labels, _scores(checkpoint, cfg, schema, valid))
        assert logged[step] == pytest.approx(want, abs=1e-4), (epoch, logged[step], want)
        assert 0.55 < want < 1.0

    best_epoch = max(epochs, key=lambda e: logged[epochs[e][1]])
    m = result.metrics
    assert m["best_epoch"] == best_epoch and m["best_valid_gauc"] == pytest.approx(logged[epochs[best_epoch][1]])
    assert Path(result.best_checkpoint).resolve() == Path(epochs[best_epoch][0]).resolve()

    # the training log window's exact metrics, at every log point
    for key in ("train_window_auc", "train_window_ne"):
        history = client.get_metric_history(result.run_id, key)
        assert history and all(e.step % 5 == 0 for e in history), key
    auc = [e.value for e in client.get_metric_history(result.run_id, "train_window_auc")]
    assert all(0.0 <= v <= 1.0 for v in auc) and max(auc) > 0.6, auc
