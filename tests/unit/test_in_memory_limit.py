"""``data.in_memory`` left null holds a rank's shard in memory up to ``data.in_memory_max_gib``, streams a larger one;
a value that is not a positive number of GiB is refused when the config is read."""

from __future__ import annotations

import pytest

from rayemb.config import load_config
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.errors import ConfigError
from rayemb.train.driver import resources

CONFIG = "jobs/configs/synth_small.yaml"
SCHEMA = DatasetSchema(label="label", dense=("d0",), sparse=(SparseFeature("s0", 1000),))


@pytest.fixture
def two_cpu_node(monkeypatch):
    monkeypatch.setattr(resources, "live_node_cpus", lambda: [2.0])


def _decide(tmp_path, overrides, rows):
    cfg = load_config(CONFIG, [f"data.path={tmp_path}", "scaling.num_workers=1", *overrides])
    schema = SCHEMA
    return resources.worker_resources(cfg, schema, None, train_rows=rows, valid_rows=0)


def test_the_shard_estimate_against_the_limit_decides(tmp_path, two_cpu_node):
    # one dense fp32, the label, one id of int64 and its int32 length a row: 20 bytes, x1.5 for tensors and objects
    rows = 1_000_000
    size = resources.shard_bytes(load_config(CONFIG, [f"data.path={tmp_path}", "scaling.num_workers=1"]),
                                 SCHEMA, None, rows, 0)
    assert size == int(rows * 20 * resources.IN_MEMORY_OVERHEAD)
    assert _decide(tmp_path, [], rows).in_memory  # 30 MB under the 2 GiB default
    under = _decide(tmp_path, [f"data.in_memory_max_gib={(size + 1) / 2**30}"], rows)
    over = _decide(tmp_path, [f"data.in_memory_max_gib={(size - 1) / 2**30}"], rows)
    assert under.in_memory and under.shard_bytes == size
    assert not over.in_memory
    # an explicit data.in_memory wins over the limit either way
    assert _decide(tmp_path, ["data.in_memory_max_gib=0.001", "data.in_memory=true"], rows).in_memory
    assert not _decide(tmp_path, ["data.in_memory=false"], rows).in_memory


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "true", "two"])
def test_a_limit_that_is_not_a_positive_number_of_gib_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="data.in_memory_max_gib"):
        load_config(CONFIG, [f"data.path={tmp_path}", f"data.in_memory_max_gib={value}"])
