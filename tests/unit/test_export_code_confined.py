"""An export's code folder is confined to the export: loading refuses any other before it imports anything.

A DeepFM export (its factory's module in ``DIR/code``) is written by :meth:`InferenceModel.save`; copies of it
are then altered so that model.json's ``code.dir`` points out of the export (``../x``, an absolute path, a
``code`` symlink to another folder, a symlinked module inside ``code``) and ``model.factory`` names a module
that exists only out there and writes a file when imported. Loading each copy (``InferenceModel.load``, which
``rayemb predict`` and the MLflow pyfunc model call) is ``bad_export_code`` naming the export and the field,
and the module never ran. The unaltered export still loads and scores.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from rayemb.errors import DataError
from rayemb.serve.user_model import BAD_EXPORT_CODE

#: a module name no other test or package uses, so only the planted file can provide it
PLANTED = "rayemb_planted_factory_module"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """(a DeepFM export written by InferenceModel.save, the dataset's validation rows)."""
    import pyarrow.parquet as pq
    import torch

    from rayemb.data.schema import DatasetSchema, parquet_files
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.serve.model import InferenceModel, build_inference_model

    data = str(tmp_path_factory.mktemp("confined_data"))
    generate(SyntheticSpec(rows=200, num_tables=3, multi_hot=False, seed=5, cardinalities=[20, 30, 40],
                           valid_fraction=0.2), data)
    schema = DatasetSchema.load(data)
    model_cfg = {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1], "sequence_tower": "none",
                 "name": "dlrm", "factory": "examples.deepfm:deepfm", "args": {"hidden": [8]}}
    torch.manual_seed(0)
    model, _ = build_inference_model(schema, model_cfg)
    out = str(tmp_path_factory.mktemp("confined_export") / "model")
    InferenceModel.from_state(model.state_dict(), schema, model_cfg).save(out, torchscript=False)
    return out, pq.read_table(parquet_files(data, "valid"))


def _planted(tmp_path):
    """A folder outside the export holding ``PLANTED.py``, which writes ``imported.txt`` when imported."""
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "imported.txt"
    (outside / f"{PLANTED}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                           "from examples.deepfm import deepfm\n")
    return outside, marker


def _altered(export_dir, tmp_path, code_dir=None):
    """A copy of the export whose model.json names the planted module as its factory (and ``code_dir``)."""
    out = tmp_path / "export"
    shutil.copytree(export_dir, out)
    info = json.loads((out / "model.json").read_text())
    info["model"]["factory"] = f"{PLANTED}:deepfm"
    if code_dir is not None:
        info["code"]["dir"] = code_dir
    (out / "model.json").write_text(json.dumps(info))
    return out


def _code_as_symlink(out, outside):
    shutil.rmtree(out / "code")
    os.symlink(outside, out / "code")


def _module_as_symlink(out, outside):
    os.symlink(outside / f"{PLANTED}.py", out / "code" / f"{PLANTED}.py")


CASES = {
    "dot-dot": ("../outside", None, "'..'"),
    "absolute": ("ABSOLUTE", None, "absolute path"),
    "code-folder-symlink": (None, _code_as_symlink, "outside the export"),
    "module-symlink": (None, _module_as_symlink, "outside the folder"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_code_folder_outside_the_export_is_refused_before_any_import(case, export, tmp_path, monkeypatch):
    from rayemb.serve.model import InferenceModel

    monkeypatch.setattr(sys, "path", list(sys.path))
    outside, marker = _planted(tmp_path)
    code_dir, alter, why = CASES[case]
    out = _altered(export[0], tmp_path, str(outside) if code_dir == "ABSOLUTE" else code_dir)
    if alter:
        alter(out, outside)

    with pytest.raises(DataError) as err:
        InferenceModel.load(str(out))
    assert err.value.category == BAD_EXPORT_CODE
    assert str(out) in str(err.value) and "code.dir" in str(err.value) and why in str(err.value)
    assert not marker.exists() and PLANTED not in sys.modules
    assert str(outside) not in sys.path


def test_the_export_as_written_loads_from_its_own_code_folder(export, tmp_path, monkeypatch):
    import numpy as np

    from rayemb.serve.model import InferenceModel

    monkeypatch.setattr(sys, "path", list(sys.path))
    export_dir, rows = export
    out = tmp_path / "export"
    shutil.copytree(export_dir, out)
    model = InferenceModel.load(str(out))
    assert os.path.realpath(sys.path[0]) == os.path.realpath(out / "code")
    assert np.all(np.isfinite(model.predict(rows)))
