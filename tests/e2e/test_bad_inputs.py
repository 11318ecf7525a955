"""Every kind of bad input a user can hand `jobs/train.py`, through the real CLI.

Each case must end with: exit code 2, one `rayemb: error:` paragraph naming the
input (and no Python traceback), and nothing half-written — no output
directory, hence no MLflow run, for errors found before the run starts. Errors
found while training (a diverging loss) must also mark the MLflow run FAILED
with the reason; that case, and credentials in the tracking URI, are tested
against a real `mlflow server` at the end, in this process on the shared local Ray.

One case runs `jobs/train.py` in a process of its own (the exit status of the
real command line); the others call the same `main` in this process: those
found before Ray starts take a fraction of a second, those found by the
statistics pass run on the shared local Ray (marked slow).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from _servers import MlflowServer, free_port

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "jobs" / "configs" / "synth_small.yaml"


def _run(args: Sequence[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _part(data: Path, split: str = "train") -> Path:
    return sorted((data / split).glob("*.parquet"))[0]


def _rewrite(path: Path, fn: Callable[[pa.Table], pa.Table]) -> None:
    pq.write_table(fn(pq.read_table(path)), path)


def _label_with(value: float, split: str = "train") -> Callable[[Path], None]:
    def mutate(data: Path) -> None:
        def fn(t: pa.Table) -> pa.Table:
            y = t.column("label").to_numpy().astype(np.float32)
            y[7] = value
            return t.set_column(t.schema.get_field_index("label"), "label", pa.array(y))

        _rewrite(_part(data, split), fn)

    return mutate


def _null_label(data: Path) -> None:
    def fn(t: pa.Table) -> pa.Table:
        y = t.column("label").to_pylist()
        y[3] = None
        return t.set_column(t.schema.get_field_index("label"), "label", pa.array(y, pa.float32()))

    _rewrite(_part(data), fn)


def _nan_dense(data: Path) -> None:
    def fn(t: pa.Table) -> pa.Table:
        x = t.column("I4").to_numpy().astype(np.float32)
        x[11] = np.nan
        return t.set_column(t.schema.get_field_index("I4"), "I4", pa.array(x))

    _rewrite(_part(data), fn)


def _id_out_of_range(data: Path) -> None:
    schema = yaml.safe_load((data / "schema.yaml").read_text())
    feat = schema["sparse"][1]

    def fn(t: pa.Table) -> pa.Table:
        x = t.column(feat["name"]).to_numpy().copy()
        x[5] = feat["num_embeddings"] + 10
        return t.set_column(t.schema.get_field_index(feat["name"]), feat["name"], pa.array(x))

    _rewrite(_part(data), fn)


def _split_in_two(data: Path, mutate_second: Callable[[pa.Table], pa.Table]) -> None:
    path = _part(data)
    t = pq.read_table(path)
    half = t.num_rows // 2
    pq.write_table(t.slice(0, half), path)
    pq.write_table(mutate_second(t.slice(half)), path.with_name("part-99999.parquet"))


def _second_file_missing_column(data: Path) -> None:
    _split_in_two(data, lambda t: t.drop(["C3"]))


def _second_file_wrong_type(data: Path) -> None:
    _split_in_two(data, lambda t: t.set_column(t.schema.get_field_index("C2"), "C2",
                                                pa.array([str(v) for v in t.column("C2").to_pylist()])))


def _truncated_file(data: Path) -> None:
    path = _part(data)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _corrupt_page(data: Path) -> None:
    path = _part(data)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3: len(raw) // 3 + 4096] = bytes(4096)  # footer intact, a data page destroyed
    path.write_bytes(bytes(raw))


def _schema_text(text: str) -> Callable[[Path], None]:
    return lambda data: (data / "schema.yaml").write_text(text)


def _schema_edit(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def mutate(data: Path) -> None:
        d = yaml.safe_load((data / "schema.yaml").read_text())
        fn(d)
        (data / "schema.yaml").write_text(yaml.safe_dump(d))

    return mutate


def _beside_the_data(module: Path) -> Callable[[Path], None]:
    """Copies a model module into the case's directory, the job's working directory."""
    return lambda data: shutil.copy(module, data.parent / module.name)


def _empty_train(data: Path) -> None:
    path = _part(data)
    pq.write_table(pq.read_table(path).slice(0, 0), path)


def _no_parquet(data: Path) -> None:
    for p in (data / "train").glob("*.parquet"):
        p.unlink()


def _fake_checkpoint(tmp: Path, ranks: Sequence[int], corrupt: Sequence[int] = (), world: int = 2) -> Path:
    """A logical checkpoint's meta.json listing ``world`` rank files; only ``ranks`` exist, ``corrupt`` ones altered."""
    import hashlib

    ckpt = tmp / "checkpoint_old"
    ckpt.mkdir()
    files = {}
    for name in [".metadata"] + [f"__{r}_0.distcp" for r in range(world)]:
        payload = f"tensor bytes of {name}".encode() * 10
        files[name] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        r = None if name == ".metadata" else int(name[2:].split("_")[0])
        if r is None or r in ranks:
            (ckpt / name).write_bytes(payload if r not in corrupt else payload[::-1])
    (ckpt / "meta.json").write_text(json.dumps({"format": "rayemb-logical-v1", "world_size": world, "epoch": 0,
                                                "step": 10, "files": files, "tables": {}}))
    return ckpt


# (id, mutate the dataset copy, extra CLI args ({tmp} is the test dir), words the message must hold, marks)
CASES: List = [
    # ---- the config ----
    pytest.param(None, ["--config", "{tmp}/absent.yaml"], ["absent.yaml", "does not exist"], id="config-missing"),
    pytest.param("config: [unclosed", ["--config", "{tmp}/bad.yaml"], ["bad.yaml", "not valid YAML"],
                 id="config-invalid-yaml"),
    pytest.param("- just\n- a list\n", ["--config", "{tmp}/bad.yaml"], ["bad.yaml", "mapping"], id="config-not-mapping"),
    pytest.param(None, ["--set", "train.epoch=2"], ["epoch", "Unknown config key"], id="config-unknown-key"),
    pytest.param(None, ["--set", "data.batch_size=-3"], ["data.batch_size", "positive"], id="config-negative-batch"),
    pytest.param(None, ["--set", "train.epochs=many"], ["train.epochs", "integer"], id="config-wrong-type"),
    pytest.param(None, ["--set", "train.epochs"], ["train.epochs", "key=value"], id="config-override-syntax"),
    pytest.param(None, ["--set", "train.early_stopping_patience=0"], ["train.early_stopping_patience"],
                 id="config-bad-patience"),
    pytest.param(None, ["--set", "planner.tables={C2: {sharding: diagonal}}"], ["C2", "diagonal", "row_wise"],
                 id="pin-unknown-sharding"),
    # ---- the dataset's files ----
    pytest.param(None, ["--set", "data.path={tmp}/absent"], ["absent", "rayemb gen-data"], id="data-path-missing"),
    pytest.param(lambda d: (d / "schema.yaml").unlink(), [], ["schema.yaml", "rayemb gen-data"], id="schema-missing"),
    pytest.param(_schema_text("label: label\ndense: [I1\n"), [], ["schema.yaml", "not valid YAML", "line"],
                 id="schema-invalid-yaml"),
    pytest.param(_schema_text("just a string\n"), [], ["schema.yaml", "mapping"], id="schema-not-mapping"),
    pytest.param(_schema_edit(lambda d: d.pop("sparse")), [], ["schema.yaml", "sparse"], id="schema-no-sparse"),
    pytest.param(_schema_edit(lambda d: d["sparse"][0].update(num_embeddings=0)), [], ["num_embeddings=0"],
                 id="schema-zero-rows"),
    pytest.param(_no_parquet, [], ["no parquet files", "train/"], id="split-without-files"),
    pytest.param(_second_file_missing_column, [], ["part-99999.parquet", "C3", "missing"],
                 id="second-file-missing-column"),
    pytest.param(_second_file_wrong_type, [], ["part-99999.parquet", "C2", "int64"], id="second-file-wrong-type"),
    pytest.param(_truncated_file, [], ["part-00000.parquet", "corrupt or truncated"], id="parquet-truncated"),
    pytest.param(None, ["--set", "data.stats_path={tmp}/stats.json"], ["stats.json", "not valid JSON"],
                 id="stats-json-corrupt"),
    pytest.param(None, ["--set", "train.resume_from={tmp}/no-such-checkpoint"], ["no-such-checkpoint", "does not exist"],
                 id="resume-missing-dir"),
    pytest.param("ckpt-missing-rank", [], ["__1_0.distcp is missing", "train.resume_from"], id="resume-missing-rank-file"),
    pytest.param("ckpt-corrupt-rank", [], ["__0_0.distcp is corrupt", "train.resume_from"], id="resume-corrupt-rank-file"),
    # ---- the model and its tasks ----
    pytest.param(None, ["--set", "model.factory=no_such_pkg_xyz.models:build"],
                 ["no_such_pkg_xyz.models", "cannot be imported", "PYTHONPATH"], id="model-factory-missing"),
    pytest.param(None, ["--set", "train.task_weights={ctr: 2.0}"], ["train.task_weights.ctr", "no such label column",
                                                                    "['label']"], id="task-without-label"),
    pytest.param(_schema_edit(lambda d: d.update(label=["label", "like"])), [], ["like", "missing"],
                 id="label-column-missing"),
]


# Values, found by the statistics pass: run in this process on the shared local Ray (a job per case would start
# a Ray each), through the same entry point as the command line.
VALUE_CASES: List = [
    pytest.param(_label_with(float("nan")), [], ["label", "NaN", "train"], id="label-nan"),
    pytest.param(_label_with(2.0), [], ["label", "not 0 or 1", "2.0"], id="label-not-binary"),
    pytest.param(_null_label, [], ["label", "null"], id="label-null"),
    pytest.param(_label_with(float("inf"), split="valid"), [], ["label", "valid", "infinite"], id="valid-label-inf"),
    pytest.param(_nan_dense, [], ["I4", "NaN"], id="dense-nan"),
    pytest.param(_id_out_of_range, [], ["out-of-range", "data.id_policy"], id="id-out-of-range"),
    pytest.param(_corrupt_page, [], ["part-00000.parquet", "corrupt or truncated"], id="parquet-corrupt-page"),
    pytest.param(_empty_train, [], ["0 rows", "fewer than one global batch"], id="split-empty"),
    # the model contract, checked on the planning task (the model built once on the meta device)
    pytest.param(_beside_the_data(REPO / "tests" / "fixtures" / "user_models" / "broken_models.py"),
                 ["--set", "model.factory=broken_models:drops_the_embeddings"],
                 ["broken_models:drops_the_embeddings", "self.embedding = embeddings.pooled"], id="model-breaks-contract"),
]


@pytest.mark.timeout(120)
def test_bad_input_in_a_process_of_its_own_exits_2_with_one_clear_error(tmp_path, tiny_data):
    """The real command line, exit status included; the cases below call the same ``main`` in this process."""
    argv, out = _prepare(tmp_path, tiny_data, None, ["--set", "train.epoch=2"])
    p = _run(argv, cwd=tmp_path)
    _assert_one_clear_error(p.returncode, p.stdout, p.stderr, ["epoch", "Unknown config key"], out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mutate,args,needles", CASES)
def test_bad_input_is_a_clear_error_and_nothing_is_written(tmp_path, tiny_data, mutate, args, needles, monkeypatch):
    _assert_main_fails_clearly(tmp_path, tiny_data, mutate, args, needles, monkeypatch)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mutate,args,needles", VALUE_CASES)
def test_bad_value_is_a_clear_error_and_nothing_is_written(ray_2_cpus, tmp_path, tiny_data, mutate, args, needles,
                                                           monkeypatch):
    _assert_main_fails_clearly(tmp_path, tiny_data, mutate, args, needles, monkeypatch)


def _assert_main_fails_clearly(tmp_path, tiny_data, mutate, args, needles, monkeypatch) -> None:
    """``jobs/train.py``'s ``main`` on the case's inputs, in this process: exit 2, one clear error, no output."""
    argv, out = _prepare(tmp_path, tiny_data, mutate, args)
    monkeypatch.chdir(tmp_path)
    # Plain buffers, never closed: a thread of Ray Data's reader may log after the error, and capfd's stream
    # would be closed under it by the next case, which logging reports with a traceback of its own.
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = _train_main()(argv)
    _assert_one_clear_error(rc, stdout.getvalue(), stderr.getvalue(), needles, out)


@functools.lru_cache(maxsize=1)
def _train_main() -> Callable[[List[str]], int]:
    """``jobs/train.py``'s ``main``, loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_jobs_train", REPO / "jobs" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _prepare(tmp_path: Path, tiny_data: str, mutate, args: Sequence[str]):
    """The case's dataset copy and files under ``tmp_path``; returns (argv of jobs/train.py, output dir)."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    (tmp_path / "stats.json").write_text("{ not json")
    out = tmp_path / "out"
    extra: List[str] = []
    if callable(mutate):
        mutate(data)
    elif mutate == "ckpt-missing-rank":
        extra = ["--set", f"train.resume_from={_fake_checkpoint(tmp_path, ranks=[0])}"]
    elif mutate == "ckpt-corrupt-rank":
        extra = ["--set", f"train.resume_from={_fake_checkpoint(tmp_path, ranks=[0, 1], corrupt=[0])}"]
    elif isinstance(mutate, str):
        (tmp_path / "bad.yaml").write_text(mutate)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    base = [] if "--config" in args else ["--config", str(CONFIG)]
    return [*base, "--set", f"data.path={data}", "--set", f"tracking.output_dir={out}", "--set", "data.batch_size=256",
            *extra, *args], out


def _assert_one_clear_error(rc: int, stdout: str, stderr: str, needles: Sequence[str], out: Path) -> None:
    assert rc == 2, (rc, stdout[-2000:], stderr[-4000:])
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr[-4000:]
    errors = [line for line in stderr.splitlines() if line.startswith("rayemb: error: ")]
    assert len(errors) == 1, stderr[-4000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert not out.exists(), f"half-written outputs: {list(out.rglob('*'))[:10]}"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port())
    server.start()
    try:
        server.wait_healthy()
        yield server
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_diverging_loss_fails_the_run_with_the_step_and_keeps_credentials_out(ray_2_cpus, tmp_path, tiny_data,
                                                                               mlflow_server, monkeypatch):
    """A learning rate that makes the loss non-finite: exit 2, its steps named, the MLflow run FAILED with the
    reason. The tracking URI carries credentials, which must appear in no output, param, tag or artifact.
    The job runs in this process on the shared local Ray: the workers' log lines that Ray forwards to the
    driver are in the output checked."""
    from mlflow import MlflowClient

    secret = "s3cr3t-pw"
    uri = f"http://alice:{secret}@127.0.0.1:{mlflow_server.port}"
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = _train_main()([
            "--config", str(CONFIG), "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={out}",
            "--set", "data.batch_size=256", "--set", "train.dense_lr=1e30", "--set", "train.embedding_lr=1e30",
            "--set", "scaling.max_failures=0", "--set", "tracking.experiment=diverge",
            "--set", "planner.calibrate=false",  # the failure is under test, not the plan
            "--set", f"tracking.tracking_uri={uri}"])
    stdout, stderr = stdout.getvalue(), stderr.getvalue()
    assert rc == 2, (rc, stdout[-3000:], stderr[-4000:])
    errors = [line for line in stderr.splitlines() if line.startswith("rayemb: error: ")]
    # the loss is read at log points and epoch ends: the window of steps it diverged in is named
    assert len(errors) == 1 and "training loss became" in errors[0], stderr[-3000:]
    assert re.search(r"(at step \d+|between step \d+ and step \d+) \(epoch \d+\)", errors[0]), errors[0]
    assert "train.dense_lr" in errors[0]
    assert secret not in stdout + stderr
    assert f"alice:***@127.0.0.1:{mlflow_server.port}" in stdout  # the store is still shown, redacted

    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name("diverge")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FAILED"
    assert "training loss became" in run.data.tags["rayemb.failure_reason"]
    assert run.data.params["tracking.tracking_uri"] == f"http://alice:***@127.0.0.1:{mlflow_server.port}"
    every_value = [*run.data.params.values(), *run.data.tags.values()]
    assert not [v for v in every_value if secret in v]
    config_text = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    assert secret not in Path(config_text).read_text()
