"""The written split of an ``EmbeddingTrainer(datasets={...})`` job is checked against the rows its dataset produced.

Rows written somewhere the driver does not see (a Ray task's own node) or dropped on the way to the disk must stop
the job with one error naming the split, not train on a part of the data.
"""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.data.materialize import _check_rows
from rayemb.errors import DataError


def _split(folder, sizes):
    folder.mkdir()
    start = 0
    for i, n in enumerate(sizes):
        pq.write_table(pa.table({"id": list(range(start, start + n))}), folder / f"part-{i:05d}.parquet")
        start += n
    return str(folder)


def test_files_holding_every_produced_row_pass(tmp_path):
    _check_rows("train", _split(tmp_path / "train", [3, 4]), 7)


@pytest.mark.parametrize("produced", [8, 6])
def test_files_holding_other_rows_than_the_dataset_produced_are_refused(tmp_path, produced):
    dest = _split(tmp_path / "valid", [3, 4])
    with pytest.raises(DataError) as e:
        _check_rows("valid", dest, produced)
    assert e.value.category == "rows_lost"
    assert "datasets['valid']" in str(e.value) and f"{produced:,} rows but 7 reached" in str(e.value)


def test_an_empty_split_folder_holds_no_rows(tmp_path):
    with pytest.raises(DataError) as e:
        _check_rows("train", _split(tmp_path / "train", []), 5)
    assert e.value.category == "rows_lost"
