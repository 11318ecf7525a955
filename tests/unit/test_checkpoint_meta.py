"""CheckpointMeta: the training entries of a checkpoint's meta.json, written and read in one place.

A checkpoint written by today's loop reads back field for field and writes the same entries again;
one written before an entry existed (only epoch and step, as the first logical checkpoints and the
tests' ``save_logical`` calls have) reads with the defaults every reader used; a real meta.json
written by ``save_logical`` (a one-rank gloo group) holds exactly ``to_dict()`` beside the store's own
entries.
"""

from __future__ import annotations

import json
import os

import pytest

from _tiny_checkpoint import tiny_model

from rayemb.batch_shape import BatchShape
from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.checkpoint.reader import META_FILE, read_meta
from rayemb.checkpoint.store import save_logical
from rayemb.errors import DataError
from rayemb.train.worker.resume import position_from_meta

#: the entries the training loop wrote into meta.json before CheckpointMeta (a mid-epoch checkpoint)
LOOP_WRITTEN = {
    "dense_transforms": {"I1": "log1p", "I2": {"standardize": {"mean": 1.5, "std": 2.0}}},
    "plan_fingerprint": "3f2a9c0d", "global_batch": 512,
    "placements": {"C1": "hybrid", "C2": "data_parallel"}, "world_size_planned": 2,
    "epoch": 1, "step": 130, "epoch_complete": False, "epoch_samples": 30 * 512,
    "best_valid_auc": 0.71, "best_epoch": 0, "epochs_without_gain": 0,
}
#: the store's entries of a meta.json (not the training's)
STORE_WRITTEN = {"format": "rayemb-logical-v1", "world_size": 2, "tables": {"C1": {"num_embeddings": 10, "dim": 4}},
                 "states": ["weight"], "rng": [], "files": {}}


def test_the_loops_entries_read_back_and_write_the_same():
    meta = CheckpointMeta.from_dict({**LOOP_WRITTEN, **STORE_WRITTEN})
    assert (meta.epoch, meta.step, meta.epoch_complete, meta.epoch_samples) == (1, 130, False, 15_360)
    assert (meta.plan_fingerprint, meta.global_batch, meta.world_size_planned, meta.world_size) == ("3f2a9c0d", 512, 2, 2)
    assert meta.placements == LOOP_WRITTEN["placements"]
    assert meta.dense_transforms == LOOP_WRITTEN["dense_transforms"]
    assert meta.early_stopping == {"best_valid_auc": 0.71, "best_epoch": 0, "epochs_without_gain": 0}
    assert meta.to_dict() == {**LOOP_WRITTEN, "world_size": 2}
    assert CheckpointMeta.from_dict(meta.to_dict()) == meta


def test_the_loops_meta_at_a_checkpoint_writes_the_entries_it_always_wrote():
    job = CheckpointMeta(plan_fingerprint="3f2a9c0d", global_batch=512, placements=LOOP_WRITTEN["placements"],
                         world_size_planned=2, dense_transforms=LOOP_WRITTEN["dense_transforms"])
    at = job.at(epoch=1, step=130, epoch_complete=False, epoch_samples=30 * 512,
                early_stopping={"best_valid_auc": 0.71, "best_epoch": 0, "epochs_without_gain": 0})
    assert at.to_dict() == LOOP_WRITTEN
    assert job.to_dict()["epoch"] == 0  # the job's own meta is unchanged


def test_an_old_checkpoint_reads_as_its_readers_always_read_it():
    old = CheckpointMeta.from_dict({"epoch": 2, "step": 60, **STORE_WRITTEN})
    assert old.epoch_complete and old.epoch_samples == 0 and old.early_stopping == {}
    assert old.plan_fingerprint is None and old.placements is None and old.dense_transforms is None
    assert (old.next_epoch, old.skip_steps(BatchShape(256, 3))) == (3, 0)
    assert old.trained_all(3) and not old.trained_all(4)
    # rewritten, it gains no entry it did not have (a None is "not recorded", not a value)
    assert old.to_dict() == {"epoch": 2, "step": 60, "epoch_complete": True, "epoch_samples": 0, "world_size": 2}
    pos = position_from_meta({"epoch": 2, "step": 60}, BatchShape(256, 3))
    assert (pos.step, pos.epoch, pos.skip_steps, pos.bookkeeping) == (60, 3, 0, {})


def test_mid_epoch_position_at_another_world_size():
    meta = CheckpointMeta.from_dict(LOOP_WRITTEN)
    assert meta.next_epoch == 1 and not meta.trained_all(2)
    # 30 steps of 2 x 256 done: 3 ranks of 256 skip 15,360 // 768 = 20 steps
    assert (meta.skip_steps(BatchShape(256, 2)), meta.skip_steps(BatchShape(256, 3))) == (30, 20)
    pos = position_from_meta(meta, BatchShape(256, 3))
    assert (pos.step, pos.epoch, pos.skip_steps) == (130, 1, 20) and pos.bookkeeping["best_valid_auc"] == 0.71


def test_an_entry_of_the_wrong_type_names_the_checkpoint_and_the_entry():
    with pytest.raises(DataError, match="'step'.*'ten'") as e:
        CheckpointMeta.from_dict({"epoch": 0, "step": "ten"}, shown="Checkpoint '/ckpt/checkpoint_1'")
    assert e.value.category == "bad_checkpoint" and "/ckpt/checkpoint_1" in e.value.message
    with pytest.raises(ValueError, match="early_stopping"):
        CheckpointMeta(early_stopping={"valid_auc": 0.7})


def test_save_logical_writes_exactly_the_meta_beside_the_stores_entries(one_rank_group, tmp_path):
    directory = str(tmp_path / "checkpoint_000001")
    model, opt = tiny_model(0, stepped=True)
    written = CheckpointMeta.from_dict(LOOP_WRITTEN)
    save_logical(directory, model, opt, None, {"t": (6, 4)}, written.to_dict())
    with open(os.path.join(directory, META_FILE)) as f:
        on_disk = json.load(f)
    assert {k: on_disk[k] for k in LOOP_WRITTEN} == LOOP_WRITTEN
    assert CheckpointMeta.from_dict(read_meta(directory)) == CheckpointMeta.from_dict({**LOOP_WRITTEN,
                                                                                         "world_size": 1})
