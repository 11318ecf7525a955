"""``rayemb predict`` of a multi-task and of a retrieval model on Ray Data.

Exports of a freshly initialised two-task DLRM and two-tower model (``tests/_task_exports.py``) score their
validation splits on the shared 2-CPU Ray: the multi-task model writes ``prediction_label`` and
``prediction_like`` (then the labels), the retrieval model ``score`` by default and, with ``--output``,
the rows' ``user_embedding`` or their items' ``item_embedding`` (list<float>), each equal to what the
exported model computes in-process, in the input's row order. ``--output`` on a ranking model is refused
before Ray starts any work, and nothing is written.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _read(out) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in sorted(out.glob("*.parquet"))])


def test_a_multitask_model_writes_one_column_per_task(ray_2_cpus, tmp_path, capsys):
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel
    from tests._task_exports import export, two_task_data

    data = two_task_data(str(tmp_path))
    out, _, _ = export(str(tmp_path), data, {"bottom_mlp": [8, 4], "top_mlp": [8, 1]})
    preds = tmp_path / "preds"
    assert main(["predict", "--model", out, "--data", f"{data}/valid", "--out", str(preds)]) == 0
    assert "(prediction_label, prediction_like, label, like)" in capsys.readouterr().out
    table = _read(preds)
    valid = pq.read_table(parquet_files(data, "valid"))
    assert table.column_names == ["prediction_label", "prediction_like", "label", "like"]
    want = InferenceModel.load(out).predict(valid)
    got = np.stack([table.column(c).to_numpy() for c in ("prediction_label", "prediction_like")], axis=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert table.column("like").to_pylist() == valid.column("like").to_pylist()

    refused = tmp_path / "refused"
    assert main(["predict", "--model", out, "--data", f"{data}/valid", "--out", str(refused),
                 "--output", "score"]) == 2
    assert "retrieval models only" in capsys.readouterr().err and not refused.exists()


def test_a_retrieval_model_writes_the_output_asked_for(ray_2_cpus, tmp_path):
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel
    from tests._task_exports import export, movielens

    data = movielens(str(tmp_path))
    out, _, _ = export(str(tmp_path), data, {"name": "two_tower", "args": {"item_feature": "item",
                                                                           "tower_mlp": [8, 4]}})
    loaded = InferenceModel.load(out)
    valid = pq.read_table(parquet_files(data, "valid"))
    outputs = {}
    for output, keep in ((None, "user"), ("user_embedding", "user"), ("item_embedding", "item")):
        preds = tmp_path / f"preds-{output}"
        assert main(["predict", "--model", out, "--data", f"{data}/valid", "--out", str(preds), "--keep-columns",
                     keep, "--batch-size", "16"] + ([] if output is None else ["--output", output])) == 0
        outputs[output] = _read(preds)
    assert outputs[None].column_names == ["score", "label", "user"]  # the default output
    # batches of 16 against one of 50: the float32 towers round differently at another batch size (seen 1.1e-7),
    # so scores and vectors agree to 1e-6, not bit for bit
    np.testing.assert_allclose(outputs[None].column("score").to_numpy(), loaded.predict(valid), rtol=0, atol=1e-6)
    users = outputs["user_embedding"]
    assert users.column_names == ["user_embedding", "user"] and users.schema.field(0).type == pa.list_(pa.float32())
    assert users.column("user").to_pylist() == valid.column("user").to_pylist()  # the input's row order
    np.testing.assert_allclose(np.array(users.column(0).to_pylist(), dtype=np.float32),
                               loaded.user_embeddings(valid), rtol=0, atol=1e-6)
    items = outputs["item_embedding"]
    assert items.column_names == ["item_embedding", "item"]
    np.testing.assert_allclose(np.array(items.column(0).to_pylist(), dtype=np.float32),
                               loaded.item_embeddings(valid.column("item").to_numpy()), rtol=0, atol=1e-6)
