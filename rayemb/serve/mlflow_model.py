"""The exported model in MLflow: a pyfunc model logged to a run, registered by name, and found again by URI.

:class:`RayembPyfuncModel` is a plain ``mlflow.pyfunc.PythonModel``: its
artifact is the ``rayemb export`` directory (``model.pt`` + ``model.json``),
``load_context`` rebuilds the :class:`~rayemb.serve.model.InferenceModel`
from it, and ``predict`` takes a pandas DataFrame with the dataset's columns
and returns a DataFrame with one column, ``prediction`` (probability); a
multi-task model's has one column per label, ``prediction_<label>``. A
retrieval model's takes ``params={"output": "score" | "user_embedding" |
"item_embedding"}`` and returns ``score`` (the default), or a column of float
lists (:mod:`rayemb.serve.columns`). The
class is pickled by reference, so loading needs ``rayemb`` importable. No
package index serves rayemb, so the model carries it: a wheel of the installed
copy (:mod:`rayemb.serve.own_wheel`) is its artifact
``artifacts/rayemb-<version>-py3-none-any.whl``, and the model's requirements
(requirements.txt, conda.yaml; python_env.yaml reads requirements.txt) name it
first by that path, relative to the model folder, where MLflow's environment
builders run pip: ``mlflow models serve`` builds the environment from the
model alone. A model factory's own module is inside the export artifact (its
``code/``, put on ``sys.path`` by
:meth:`~rayemb.serve.model.InferenceModel.load`), so it needs no install. The
other requirements are given explicitly (the installed versions), so logging
never resolves packages over the network.

Example::

    >>> info = log_pyfunc("models/criteo", tracking_uri, run_id, example_df, step=1200)
    >>> register(info.model_uri, "criteo-dlrm", tracking_uri, tags={"valid_auc": "0.79"})
    >>> mlflow.pyfunc.load_model("models:/criteo-dlrm/1").predict(df)["prediction"]
    >>> mlflow.pyfunc.load_model("models:/ml-two-tower/1").predict(df, params={"output": "user_embedding"})
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

import mlflow
import pandas

from rayemb import storage
from rayemb.errors import DataError, TrackingError
from rayemb.serve.columns import ITEM_EMBEDDING, SCORE, USER_EMBEDDING, output_table, prediction_columns

#: name of the export directory among the pyfunc model's artifacts
ARTIFACT_KEY = "rayemb_model"
#: name of rayemb's own wheel among the pyfunc model's artifacts
WHEEL_KEY = "rayemb_wheel"
#: the logged model's name (``runs:/<run id>/model``)
MODEL_NAME = "model"
#: the folder of an MLflow pyfunc model that holds its artifacts, each under its own base name
_ARTIFACTS_DIR = "artifacts"
#: distributions whose installed versions the model's requirements pin (rayemb first: it holds the class)
_REQUIREMENTS = ("rayemb", "torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "mlflow", "numpy", "pandas",
                 "pyarrow", "pyyaml")


class RayembPyfuncModel(mlflow.pyfunc.PythonModel):
    """An exported rayemb model as an MLflow pyfunc (module docstring)."""

    def load_context(self, context: Any) -> None:
        from rayemb.publish import resolve
        from rayemb.serve.model import InferenceModel

        self._model = InferenceModel.load(resolve(context.artifacts[ARTIFACT_KEY]))

    def predict(self, context: Any, model_input: pandas.DataFrame, params: Optional[Dict[str, Any]] = None
                ) -> pandas.DataFrame:
        output = (params or {}).get("output")
        table = output_table(self._model, model_input, output or None)
        # vectors as plain lists of floats: what a JSON response and a DataFrame reader both take
        return pandas.DataFrame({name: col.to_pylist() if col.type.num_fields else col.to_numpy()
                                 for name, col in zip(table.column_names, table.columns)})


def pip_requirements(wheel: Optional[str] = None) -> List[str]:
    """``name==version`` of the installed distributions the model needs (local metadata, no network); rayemb as
    ``wheel`` when given (its path relative to the model folder: pip resolves it there)."""
    out = [wheel] if wheel else []
    for name in _REQUIREMENTS[1:] if wheel else _REQUIREMENTS:
        try:
            out.append(f"{name}=={importlib.metadata.version(name).split('+')[0]}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def signature(schema: Any, sequence: bool = True, item_feature: Optional[str] = None) -> Any:
    """Input: the feature columns; output: ``prediction`` (double), or ``prediction_<label>`` per label.

    ``sequence`` (a model with a history tower): the schema's sequence columns too, arrays of ``long``.
    ``item_feature`` (a retrieval model): every input column optional (a user vector needs no item, an item
    vector only the item; rayemb names what an output lacks), the param ``output`` (default ``score``), and
    the outputs ``score`` (double), ``user_embedding`` and ``item_embedding`` (arrays of float).

    Dense columns are ``double`` (float32 and float64 pass; nulls read as 0),
    multi-hot columns arrays of ``long``. One-hot id columns are ``Any``:
    real data has missing categories (Criteo's empty fields), which pandas
    holds as NaN in a float column, and MLflow's ``long`` refuses those while
    its ``double`` refuses plain int64 columns; rayemb casts them to int64
    itself (a null is an empty bag, as in training; a fractional id is an error).
    Raw-id columns (``ids: raw``: int64 or string ids, or lists of either) are
    ``Any`` too: the batch conversion hashes strings as training did.
    """
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import AnyType, Array, ParamSchema, ParamSpec

    required = item_feature is None
    cols = [ColSpec(DataType.double, c, required) for c in schema.dense]
    cols += [ColSpec(Array(DataType.long) if f.multi_hot and f.ids != "raw" else AnyType(), f.name, required)
             for f in schema.sparse]
    cols += [ColSpec(Array(DataType.long), name, required) for name in (schema.sequence_names if sequence else [])]
    if required:
        outputs = [ColSpec(DataType.double, name) for name in prediction_columns(schema)]
        return ModelSignature(inputs=Schema(cols), outputs=Schema(outputs))
    outputs = [ColSpec(DataType.double, SCORE, False), ColSpec(Array(DataType.float), USER_EMBEDDING, False),
               ColSpec(Array(DataType.float), ITEM_EMBEDDING, False)]
    return ModelSignature(inputs=Schema(cols), outputs=Schema(outputs),
                          params=ParamSchema([ParamSpec("output", DataType.string, SCORE)]))


@contextlib.contextmanager
def tracking(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking and registry URI set to ``uri`` for the block; after it the tracking
    URI is restored and the registry follows it again (MLflow's default)."""
    from rayemb.tracking.store import set_client_env_defaults

    set_client_env_defaults()
    old_tracking = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else ""
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(old_tracking)
        mlflow.set_registry_uri("")


def log_pyfunc(model_dir: str, schema: Any, tracking_uri: str, run_id: str, input_example: Any, step: int = 0,
               tags: Optional[Dict[str, str]] = None) -> Any:
    """Logs ``model_dir`` (an export) as pyfunc model ``model`` of run ``run_id``; returns MLflow's ``ModelInfo``.

    The run is not resumed (its status and end time stay); ``step`` links the
    run's metrics of that step (the checkpoint's ``valid_auc``) to the model.
    """
    from mlflow.entities import LoggedModelStatus
    from mlflow.models import Model

    import json

    from rayemb.serve.model import INFO_FILE, uses_sequence
    from rayemb.serve.own_wheel import build_wheel

    with open(os.path.join(model_dir, INFO_FILE)) as f:
        exported = json.load(f)
    sequence = uses_sequence(exported.get("model", {}))
    item_feature = (exported.get("retrieval") or {}).get("item_feature")
    with tracking(tracking_uri), tempfile.TemporaryDirectory(prefix="rayemb-wheel-") as wheels:
        wheel = build_wheel(wheels)
        carried = f"{_ARTIFACTS_DIR}/{os.path.basename(wheel)}"
        client = mlflow.MlflowClient(tracking_uri)
        # made here, in the run's experiment: Model.log alone would file it under the active (default) experiment
        logged = client.create_logged_model(client.get_run(run_id).info.experiment_id, name=MODEL_NAME,
                                            source_run_id=run_id, tags=tags)
        info = Model.log(
            artifact_path=None, name=MODEL_NAME, flavor=mlflow.pyfunc, flavor_name="pyfunc.CustomPythonModel",
            run_id=run_id, model_id=logged.model_id, python_model=RayembPyfuncModel(),
            artifacts={ARTIFACT_KEY: os.path.abspath(model_dir), WHEEL_KEY: wheel},
            signature=signature(schema, sequence, item_feature), input_example=input_example,
            pip_requirements=pip_requirements(carried), step=int(step), await_registration_for=0,
        )
        saved = info.flavors["python_function"]["artifacts"][WHEEL_KEY]["path"]
        if saved != carried:  # the requirements would name a file the model does not hold
            raise RuntimeError(f"MLflow saved rayemb's wheel as {saved!r}, not {carried!r} as the model's "
                               f"requirements name it (logged model {info.model_uri})")
        if client.get_logged_model(logged.model_id).status != LoggedModelStatus.READY:
            client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        return info


def register(model_uri: str, name: str, tracking_uri: str, tags: Dict[str, str], description: str = "") -> Any:
    """A new version of registered model ``name`` (created when absent) for ``model_uri``; returns it."""
    with tracking(tracking_uri):
        version = mlflow.register_model(model_uri, name, await_registration_for=0, tags=tags)
        if description:
            mlflow.MlflowClient(tracking_uri).update_model_version(name, version.version, description=description)
    return version


def is_mlflow_uri(value: str) -> bool:
    return value.startswith(("models:/", "runs:/", "mlflow-artifacts:/"))


def _artifact_dir(mlmodel_dir: str, where: str) -> str:
    from mlflow.models import Model

    flavor = Model.load(mlmodel_dir).flavors.get("python_function", {})
    path = (flavor.get("artifacts") or {}).get(ARTIFACT_KEY, {}).get("path")
    if not path:
        raise DataError(f"{where} is an MLflow model but not one `rayemb export` logged (no {ARTIFACT_KEY!r} "
                        "artifact). Pass a model rayemb exported.", category="not_a_model")
    return os.path.join(mlmodel_dir, path)


def local_model_dir(model: str, tracking_uri: Optional[str], scratch: Optional[str] = None) -> Tuple[str, str]:
    """(local export directory, where it came from) of ``--model``: an export dir, a saved MLflow model dir,
    or a ``models:/NAME/VERSION`` / ``runs:/ID/model`` URI (downloaded into ``scratch``)."""
    if is_mlflow_uri(model):
        from mlflow.exceptions import MlflowException

        if not tracking_uri:
            raise TrackingError(f"--model {model!r} is an MLflow URI but no tracking store is known. Pass "
                                "--tracking-uri (the store `rayemb export` logged to).", category="no_store")
        scratch = scratch or tempfile.mkdtemp(prefix="rayemb-model-")
        try:
            with tracking(tracking_uri):
                local = mlflow.artifacts.download_artifacts(artifact_uri=model, dst_path=scratch,
                                                            tracking_uri=tracking_uri)
        except MlflowException as e:
            from rayemb.logs import redact_text, redact_uri

            raise TrackingError(f"MLflow model {model!r} cannot be found in the store {redact_uri(tracking_uri)!r} "
                                f"({redact_text(e.message.splitlines()[0][:200])}). Check the name and version "
                                "(`mlflow models` UI / `rayemb export --register`) and --tracking-uri.",
                                category="not_found") from None
        return _artifact_dir(local, f"--model {model!r}"), model
    from rayemb.publish import resolve
    from rayemb.serve.model import INFO_FILE, STATE_FILE

    if storage.is_remote(model):  # an export in a bucket: its published version's few files, into scratch
        from rayemb.logs import redact_uri

        published = resolve(model, expect=(INFO_FILE, STATE_FILE))
        if not storage.listdir(published):
            raise DataError(f"--model {redact_uri(model)!r} does not exist or is empty. Pass the --out of `rayemb "
                            "export`, or an MLflow URI.", category="not_found")
        local = storage.download_dir(published, os.path.join(scratch or tempfile.mkdtemp(prefix="rayemb-model-"),
                                                             "model"))
        return local_model_dir(local, tracking_uri)[0], model
    if os.path.isfile(os.path.join(model, "MLmodel")):
        return _artifact_dir(model, f"--model {model!r}"), os.path.abspath(model)
    return resolve(model), os.path.abspath(model)


__all__ = ["ARTIFACT_KEY", "MODEL_NAME", "RayembPyfuncModel", "WHEEL_KEY", "is_mlflow_uri",
           "local_model_dir", "log_pyfunc", "pip_requirements", "register", "signature", "tracking"]
