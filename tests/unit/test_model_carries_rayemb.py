"""The logged MLflow model carries rayemb as a wheel, and its requirements name that wheel inside the model.

No package index serves rayemb, so a model requiring ``rayemb==<version>`` leaves ``mlflow models serve`` with
nothing to install. A tiny DLRM checkpoint (``tests/_tiny_checkpoint.py``) is exported and logged to a real
MLflow sqlite store; the model downloaded from the store holds ``artifacts/rayemb-<version>-py3-none-any.whl``,
named by that relative path in requirements.txt and conda.yaml (python_env.yaml reads requirements.txt), and
nothing asks for rayemb by name. In a new venv (no system site-packages, run from a temp folder without
PYTHONPATH, so the repository is not importable) rayemb is absent until pip installs that wheel alone
(``--no-deps --no-index``, by the requirements line as written, from a folder of links to the model's files as
MLflow's environment builder runs it): of the version the requirement's file name says, with its modules (the pyfunc
class's module among them) and its ``rayemb`` command. The venv gets no torch (``--no-deps``): only the
installed files and metadata are read, nothing of rayemb is executed there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
import yaml
from _tiny_checkpoint import write_checkpoint

import rayemb

WHEEL = re.compile(r"^artifacts/rayemb-(?P<version>[^-]+)-py3-none-any\.whl$")

#: what the new venv reports of its rayemb: never imported, only located and read
PROBE = """
import importlib.metadata as md, importlib.util, json, os
spec = importlib.util.find_spec("rayemb")
files = [str(f) for f in md.files("rayemb")] if spec else []
print("RESULT=" + json.dumps({"found": spec is not None, "origin": spec.origin if spec else None,
                              "version": md.version("rayemb") if spec else None, "files": files}))
"""


@pytest.fixture(scope="module")
def logged_model(tmp_path_factory):
    """The MLflow model of a tiny DLRM export, downloaded from its store into a local folder."""
    import mlflow

    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.serve.export import export_model, source_from_checkpoint
    from rayemb.serve.mlflow_model import tracking
    from rayemb.serve.model import model_config

    root = tmp_path_factory.mktemp("carried_wheel")
    data = str(root / "data")
    generate(SyntheticSpec(rows=120, num_tables=2, seed=1, cardinalities=[10, 20], valid_fraction=0.25), data)
    schema = DatasetSchema.load(data)
    cfg = config_from_dict({"name": "carried-wheel", "data": {"path": data},
                            "model": {"embedding_dim": 4, "bottom_mlp": [4], "top_mlp": [4, 1]},
                            "tracking": {"output_dir": str(root / "runs"), "experiment": "carried-wheel"}})
    (root / "job.yaml").write_text(cfg.to_yaml())
    checkpoint = write_checkpoint(str(root / "ckpt"), schema, model_config(cfg), seed=1)
    uri = f"sqlite:///{root}/mlflow.db"
    cwd = os.getcwd()
    os.chdir(root)  # nothing MLflow writes may land in the repository
    try:
        summary = export_model(source_from_checkpoint(checkpoint, str(root / "job.yaml"), uri), str(root / "out"))
        with tracking(uri):
            local = mlflow.artifacts.download_artifacts(artifact_uri=summary["model_uri"],
                                                        dst_path=str(root / "dl"), tracking_uri=uri)
    finally:
        os.chdir(cwd)
    return local


def _carried(model_dir):
    """The requirements.txt line naming rayemb's wheel, and the version its file name says."""
    with open(os.path.join(model_dir, "requirements.txt")) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    assert not [ln for ln in lines if re.match(r"^rayemb\s*[=<>~!]", ln)], lines  # no index serves rayemb
    wheels = [ln for ln in lines if WHEEL.match(ln)]
    assert len(wheels) == 1, lines
    return wheels[0], WHEEL.match(wheels[0]).group("version")


def test_the_requirements_name_the_wheel_inside_the_model(logged_model):
    line, version = _carried(logged_model)
    assert not os.path.isabs(line) and ".." not in line.split("/")
    assert os.path.isfile(os.path.join(logged_model, line))
    assert version == rayemb.__version__
    with open(os.path.join(logged_model, "conda.yaml")) as f:
        conda = yaml.safe_load(f)
    pip = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert line in pip and not [p for p in pip if re.match(r"^rayemb\s*[=<>~!]", p)], pip
    with open(os.path.join(logged_model, "python_env.yaml")) as f:
        assert yaml.safe_load(f)["dependencies"] == ["-r requirements.txt"]
    with zipfile.ZipFile(os.path.join(logged_model, line)) as z:
        names = set(z.namelist())
    assert {"rayemb/__init__.py", "rayemb/serve/mlflow_model.py", "rayemb/serve/model.py",
            f"rayemb-{version}.dist-info/METADATA", f"rayemb-{version}.dist-info/RECORD"} <= names


def test_a_new_venv_gets_rayemb_from_the_wheel_alone(logged_model, tmp_path):
    line, version = _carried(logged_model)
    venv, cwd = tmp_path / "venv", tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, cwd=cwd, env=env, timeout=300)
    python = str(venv / "bin" / "python")

    def probe():
        p = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT=")][-1][len("RESULT="):])

    assert not probe()["found"]  # the venv does not see the repository's or the test's rayemb
    # as MLflow builds a model's environment: pip run in a folder of links to the model folder's entries, on a
    # requirements file there; this one holds only the requirements.txt line of the wheel, as it is written
    build = tmp_path / "build"
    build.mkdir()
    for name in os.listdir(logged_model):
        os.symlink(os.path.join(logged_model, name), build / name)
    (build / "only-rayemb.txt").write_text(line + "\n")
    p = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                        "-r", "only-rayemb.txt"], capture_output=True, text=True, cwd=build, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    got = probe()
    assert got["found"] and got["version"] == version == rayemb.__version__
    assert os.path.realpath(got["origin"]).startswith(os.path.realpath(venv) + os.sep)
    assert {"rayemb/serve/mlflow_model.py", "rayemb/serve/own_wheel.py", "rayemb/_version.py"} <= set(got["files"])
    site = os.path.dirname(os.path.dirname(got["origin"]))
    with open(os.path.join(site, "rayemb", "_version.py")) as f:
        assert f'__version__ = "{version}"' in f.read()
    assert (venv / "bin" / "rayemb").is_file()  # the entry point came with the metadata


def test_an_installed_copy_builds_the_same_wheel(logged_model, tmp_path):
    """What a container image has (rayemb installed from a wheel, not a checkout) gives the same wheel."""
    line, _ = _carried(logged_model)
    site, cwd = tmp_path / "site", tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                        "--target", str(site), os.path.join(logged_model, line)], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    script = ("import json, sys, rayemb; from rayemb.serve.own_wheel import build_wheel; "
              "print('RESULT=' + json.dumps([rayemb.__file__, build_wheel(sys.argv[1])]))")
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "again")], capture_output=True, text=True,
                       cwd=cwd, env={**env, "PYTHONPATH": str(site)}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    origin, again = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT=")][-1][7:])
    assert os.path.realpath(origin) == os.path.realpath(site / "rayemb" / "__init__.py")  # not the checkout
    with open(os.path.join(logged_model, line), "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read()
