"""``write_dataset_folder``: the Ray Datasets of ``EmbeddingTrainer(datasets={...})`` written once, by the driver.

The rows come out in the datasets' order even when a later block is produced before an earlier one, in files of at
most ``ROWS_PER_FILE`` rows; a split that fails part-way leaves neither the folder nor its staging folder behind.
The rows written from blocks produced on another node are tests/cluster/test_materialize_multinode.py's.
"""

import os
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rayemb.data import materialize
from rayemb.data.materialize import write_dataset_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCHEMA = {"label": "label", "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 10}]}
ROWS, BLOCKS = 6_000, 6


def _preprocessing(fail_on_last_block=False):
    """The caller's preprocessing; the first block is the slowest, so the blocks after it finish before it.

    Built in a function so that Ray pickles it by value: no Ray worker can import this test module.
    """

    def columns(batch):
        ids = np.asarray(batch["id"])
        if fail_on_last_block and ids[-1] == ROWS - 1:
            raise ValueError("preprocessing failed")
        if ids[0] == 0:
            time.sleep(2.0)
        out = {"id": ids, "label": (ids % 2).astype("float32"), "I1": ids.astype("float32"), "C1": ids % 10}
        return pd.DataFrame(out) if isinstance(batch, pd.DataFrame) else out  # a pandas batch makes a pandas block

    return columns


def test_rows_are_written_in_the_datasets_order_in_bounded_files(ray_2_cpus, tmp_path, monkeypatch):
    monkeypatch.setattr(materialize, "ROWS_PER_FILE", 1_500)
    rows = ray_2_cpus.data.range(ROWS, override_num_blocks=BLOCKS)
    ds = rows.map_batches(_preprocessing(), batch_size=None)
    valid = rows.map_batches(_preprocessing(), batch_format="pandas", batch_size=None)
    folder = write_dataset_folder({"train": ds, "valid": valid}, SCHEMA, str(tmp_path / "ds"))

    assert sorted(os.listdir(tmp_path)) == ["ds"] and sorted(os.listdir(folder)) == ["schema.yaml", "train", "valid"]
    for split in ("train", "valid"):
        files = sorted(os.listdir(os.path.join(folder, split)))
        assert files == [f"part-{i:05d}.parquet" for i in range(ROWS // 1_500)], files
        table = pq.read_table(os.path.join(folder, split))
        assert table.column("id").to_pylist() == list(range(ROWS)), split
        assert table.column("C1").to_pylist() == [i % 10 for i in range(ROWS)], split
    # the caller's dataset keeps its own setting once written
    assert ds.context.execution_options.preserve_order is False


def test_a_split_failing_part_way_leaves_no_folder(ray_2_cpus, tmp_path):
    rows = ray_2_cpus.data.range(ROWS, override_num_blocks=BLOCKS)
    train = rows.map_batches(_preprocessing(), batch_size=None)
    valid = rows.map_batches(_preprocessing(fail_on_last_block=True), batch_size=None)
    with pytest.raises(Exception, match="preprocessing failed"):
        write_dataset_folder({"train": train, "valid": valid}, SCHEMA, str(tmp_path / "ds"))
    assert os.listdir(tmp_path) == []
