"""Checkpoint integrity checks, where a resumed job continues, and the elastic worker config."""

from __future__ import annotations

import hashlib
import json

import pytest

from rayemb.batch_shape import BatchShape
from rayemb.checkpoint.exchange import row_range
from rayemb.checkpoint.reader import FORMAT, checkpoints_newest_first, verify
from rayemb.config import load_config
from rayemb.errors import ConfigError, DataError
from rayemb.train.worker.resume import position_from_meta


def _checkpoint(path, step=10, files=("__0_0.distcp", "__1_0.distcp", ".metadata")):
    path.mkdir(parents=True)
    listed = {}
    for name in files:
        payload = (name * 50).encode()
        (path / name).write_bytes(payload)
        listed[name] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (path / "meta.json").write_text(json.dumps({"format": FORMAT, "world_size": 2, "step": step, "epoch": 0,
                                                "files": listed, "tables": {}}))
    return path


def test_verify_accepts_an_intact_checkpoint(tmp_path):
    assert verify(str(_checkpoint(tmp_path / "c")))["step"] == 10


@pytest.mark.parametrize("damage,needle", [
    (lambda p: (p / "__1_0.distcp").unlink(), "__1_0.distcp is missing"),
    (lambda p: (p / "__0_0.distcp").write_bytes(b"short"), "__0_0.distcp has 5 bytes"),
    (lambda p: (p / "__0_0.distcp").write_bytes((p / "__0_0.distcp").read_bytes()[::-1]), "__0_0.distcp is corrupt"),
    (lambda p: (p / "meta.json").unlink(), "no readable meta.json"),
    (lambda p: (p / "meta.json").write_text('{"format": "other"}'), "no readable meta.json"),
])
def test_verify_names_what_is_wrong(tmp_path, damage, needle):
    ckpt = _checkpoint(tmp_path / "c")
    damage(ckpt)
    with pytest.raises(DataError) as e:
        verify(str(ckpt))
    assert needle in e.value.message and e.value.category == "bad_checkpoint"


def test_size_check_runs_without_hashes_but_a_flipped_byte_needs_them(tmp_path):
    ckpt = _checkpoint(tmp_path / "c")
    raw = bytearray((ckpt / "__0_0.distcp").read_bytes())
    raw[3] ^= 0xFF
    (ckpt / "__0_0.distcp").write_bytes(bytes(raw))
    assert verify(str(ckpt), hashes=False)["step"] == 10
    with pytest.raises(DataError, match="corrupt"):
        verify(str(ckpt))


def test_fallback_order_is_newest_step_first_and_skips_non_checkpoints(tmp_path):
    _checkpoint(tmp_path / "checkpoint_b", step=20)
    _checkpoint(tmp_path / "checkpoint_a", step=30)
    _checkpoint(tmp_path / "checkpoint_c", step=10)
    (tmp_path / "checkpoint_partial").mkdir()  # a crash before meta.json: not a checkpoint
    names = [p.rsplit("/", 1)[-1] for p in checkpoints_newest_first(str(tmp_path))]
    assert names == ["checkpoint_a", "checkpoint_b", "checkpoint_c"]


@pytest.mark.parametrize("rows,world", [(10, 3), (2, 4), (7, 1), (1000, 7)])
def test_canonical_row_ranges_tile_the_table(rows, world):
    ranges = [row_range(rows, r, world) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_position_after_an_epoch_end_and_mid_epoch_at_another_world_size():
    end = {"epoch": 1, "step": 140, "epoch_complete": True, "best_valid_auc": 0.7, "best_epoch": 1}
    pos = position_from_meta(end, BatchShape(256, 3))
    assert (pos.step, pos.epoch, pos.skip_steps) == (140, 2, 0) and pos.bookkeeping["best_epoch"] == 1
    # 2 ranks x 256 x 30 steps = 15,360 samples of epoch 1 done; 3 ranks skip 15,360 // 768 = 20 steps
    mid = {"epoch": 1, "step": 100, "epoch_complete": False, "epoch_samples": 30 * 512}
    pos = position_from_meta(mid, BatchShape(256, 3))
    assert (pos.step, pos.epoch, pos.skip_steps) == (100, 1, 20)
    assert position_from_meta(mid, BatchShape(256, 2)).skip_steps == 30


def test_elastic_num_workers_and_its_errors():
    cfg = load_config("jobs/configs/synth_small.yaml", ["scaling.num_workers=[1, 3]"])
    assert (cfg.scaling.min_workers, cfg.scaling.num_workers) == (1, 3)
    assert load_config("jobs/configs/synth_small.yaml", ["scaling.num_workers=2"]).scaling.min_workers is None
    for bad in ("[3, 1]", "[0, 2]", "[1, 2, 3]", "two"):
        with pytest.raises(ConfigError, match="scaling.num_workers"):
            load_config("jobs/configs/synth_small.yaml", [f"scaling.num_workers={bad}"])
    with pytest.raises(ConfigError, match="train.keep_checkpoints"):
        load_config("jobs/configs/synth_small.yaml", ["train.keep_checkpoints=1"])


def test_checkpoint_schedule_by_steps_and_by_time(monkeypatch):
    import time as time_module

    from rayemb.train.worker.resume import CheckpointSchedule

    by_steps = CheckpointSchedule(every_n_steps=20, every_s=None, rank=0)
    assert [s for s in range(1, 61) if by_steps.due(s)] == [20, 40, 60]
    assert by_steps.due_flag() == 0.0
    clock = [1000.0]
    monkeypatch.setattr(time_module, "monotonic", lambda: clock[0])
    by_time = CheckpointSchedule(every_n_steps=None, every_s=30.0, rank=0)
    other_rank = CheckpointSchedule(every_n_steps=None, every_s=30.0, rank=1)
    clock[0] += 29.0
    assert by_time.due_flag() == 0.0
    clock[0] += 2.0
    # rank 0 decides; the flag is summed over ranks by the loop's all-reduce, so every rank agrees
    flag = by_time.due_flag() + other_rank.due_flag()
    assert flag == 1.0 and by_time.due(7, flag) and other_rank.due(7, flag)
    by_time.saved()
    assert by_time.due_flag() == 0.0
