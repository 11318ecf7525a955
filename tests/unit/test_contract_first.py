"""A user's factory that breaks the model contract is refused at input checking, before Ray starts and before the
statistics pass: `rayemb train` in a process of its own (a driver without TorchRec, which builds the model in a
subprocess) exits 2 naming the fix; in a process with TorchRec loaded the same check builds it in place."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayemb.config import load_config
from rayemb.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "user_models"


def _args(tiny_data: str, tmp_path: Path, factory: str):
    return ["--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={tmp_path / 'runs'}",
            "--set", f"model.factory={factory}"]


@pytest.mark.timeout(180)
def test_rayemb_train_exits_2_on_a_broken_contract_before_ray_and_the_statistics(tiny_data, tmp_path):
    shutil.copy(FIXTURES / "broken_models.py", tmp_path / "broken_models.py")  # the job's workspace
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run([sys.executable, "-m", "rayemb.cli", "train", "--config", str(REPO / "jobs" / "configs" /
                                                                                       "synth_small.yaml"),
                        *_args(tiny_data, tmp_path, "broken_models:drops_the_embeddings")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out[-3000:]
    assert "broken_models:drops_the_embeddings" in out and "self.embedding = embeddings.pooled" in out
    # nothing after the input checks ran: no Ray, no statistics pass, no output folder
    assert "Started a local Ray instance" not in out and "statistics pass" not in out, out[-3000:]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("factory,says", [
    ("broken_models:own_table", "holds embedding tables rayemb did not build"),
    ("broken_models:returns_a_dict", "not a torch.nn.Module"),
])
def test_check_inputs_builds_the_factory_with_torchrec_loaded(tiny_data, tmp_path, monkeypatch, factory, says):
    import ray
    import torchrec  # noqa: F401 - the driver has it: the model is built here, no subprocess

    from rayemb.train.driver.trainer import check_inputs

    monkeypatch.syspath_prepend(str(FIXTURES))
    cfg = load_config(str(REPO / "jobs" / "configs" / "synth_small.yaml"),
                      [a for a in _args(tiny_data, tmp_path, factory) if a != "--set"])
    with pytest.raises(ConfigError) as e:
        check_inputs(cfg)
    assert e.value.category == "bad_model_factory" and says in str(e.value)
    assert not ray.is_initialized()


def test_a_factory_keeping_the_contract_passes_the_early_check(tiny_data, tmp_path):
    from rayemb.train.driver.trainer import check_inputs

    cfg = load_config(str(REPO / "jobs" / "configs" / "synth_small.yaml"),
                      [a for a in _args(tiny_data, tmp_path, "examples.deepfm:deepfm") if a != "--set"])
    assert check_inputs(cfg).model.name == "examples.deepfm:deepfm"
