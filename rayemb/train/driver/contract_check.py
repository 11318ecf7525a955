"""The model contract checked first: a user's factory built once, before the job's statistics and calibration.

A factory that breaks the contract (:func:`rayemb.contract.model.check_model`) fails when the model is first
built, and the plan's build (on the meta device, in the planning task) comes after the statistics pass and the
calibration, a minute into the job. :func:`check_factory_first` builds it at input checking instead: on the meta
device (no memory, no kernels), from a provisional plan (every table an ordinary ``EmbeddingBagCollection``, no
hot ids: what the planner makes without statistics), so that a contract error exits 2 before Ray starts.

The build needs TorchRec, which the driver does not load (the plan is made in a Ray task so that it stays light:
importing torch and TorchRec takes 3-4 s and 340 MB here). So the build runs in a subprocess of this interpreter,
unless the driver has TorchRec loaded already. The shipped models keep the contract (tests/unit) and are not
built twice.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from typing import Any

#: seconds the subprocess may take: its imports, and a factory's own work on the meta device
CHECK_TIMEOUT_S = 300.0


def build_on_meta(cfg: Any, schema: Any, model: Any) -> None:
    """The job's model from ``model``'s factory on the meta device, with the provisional plan (module docstring);
    a :class:`~rayemb.errors.ConfigError` (``bad_model_factory``) when it breaks the contract."""
    import torch

    from rayemb.train.sharding import build_model

    meta = torch.device("meta")
    build_model(cfg, schema, {}, {}, meta, meta, model=model)


def check_factory_first(cfg: Any, schema: Any, model: Any) -> None:
    """Raises the contract's :class:`~rayemb.errors.ConfigError` of a user's factory (``model``, a ModelSpec)
    before any work. Another failure of the early build (the subprocess's environment) is said and left to the
    planning task's build."""
    if isinstance(model.factory, str):  # a shipped model
        return
    if "torchrec" in sys.modules:  # loaded here already: nothing to keep light
        build_on_meta(cfg, schema, model)
        return
    from ray import cloudpickle

    from rayemb.errors import RayembError

    with tempfile.TemporaryDirectory(prefix="rayemb-contract-") as tmp:
        job, result = os.path.join(tmp, "job.pkl"), os.path.join(tmp, "result.pkl")
        with open(job, "wb") as f:
            cloudpickle.dump((cfg, schema, model), f)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            proc = subprocess.run([sys.executable, "-m", "rayemb.train.driver.contract_check", job, result], env=env,
                                  capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
            failure = None
            if os.path.exists(result):
                with open(result, "rb") as f:
                    failure = pickle.load(f)
        except (OSError, subprocess.TimeoutExpired, pickle.UnpicklingError, EOFError) as e:
            proc, failure = None, f"{type(e).__name__}: {e}"
    if isinstance(failure, RayembError):
        raise failure
    if failure is not None or proc is None or proc.returncode != 0:
        why = failure or (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"rayemb: WARNING: the model factory {model.name} could not be built before the job "
              f"({why}); the plan's build checks it", flush=True)


def main(argv: Any = None) -> int:
    """The subprocess: builds the pickled (config, schema, ModelSpec) of ``argv[0]``; writes the failure to
    ``argv[1]`` (a RayembError, or the text of another one)."""
    job, result = (argv or sys.argv[1:])[:2]
    from rayemb.errors import RayembError

    try:
        with open(job, "rb") as f:
            cfg, schema, model = pickle.load(f)
        build_on_meta(cfg, schema, model)
        return 0
    except RayembError as e:
        failure: Any = e
    except Exception as e:  # noqa: BLE001 - said by the driver, which goes on
        failure = f"{type(e).__name__}: {e}"
    with open(result, "wb") as f:
        pickle.dump(failure, f)
    return 1


__all__ = ["check_factory_first", "build_on_meta"]

if __name__ == "__main__":
    sys.exit(main())
