"""Which model a job trains: a shipped one by name, or a user's factory by ``package.module:function``.

The YAML's ``model`` section selects it::

    model:
      name: dlrm                          # a shipped model (rayemb.models), or
      factory: "my_team.models:deepfm"    # any importable function, with
      args: {hidden: [256, 128]}          # its keyword arguments

:func:`model_spec` resolves the selection once, on the driver, into a
:class:`ModelSpec` (the function itself and its arguments) that travels to the
workers, the plan probe and the calibration. A factory from a module outside
the installed packages (a file next to the job's config) travels by value, so
the workers need no copy of it on their path.
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Union

from rayemb.errors import BAD_FACTORY, ConfigError

#: model.name -> the shipped factory
SHIPPED_MODELS: Dict[str, str] = {"dlrm": "rayemb.models.dlrm:dlrm", "dcn_v2": "rayemb.models.dcn_v2:dcn_v2",
                                   "two_tower": "rayemb.models.two_tower:two_tower"}


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model selection: ``factory(embeddings, schema, **args)`` builds the model."""

    #: the function, or for a shipped model its ``module:function`` (imported where the model is built, so
    #: that the driver never loads TorchRec for it)
    factory: Union[Callable[..., Any], str]
    args: Mapping[str, Any] = field(default_factory=dict)
    #: how the config named it: a shipped name or ``package.module:function``
    name: str = "dlrm"
    #: a loss of the user's, ``loss(output, labels) -> scalar`` (None: BCE per label, rayemb.train.worker.losses)
    loss: Optional[Callable[..., Any]] = None

    def build(self, embeddings: Any, schema: Any) -> Any:
        """The model, checked against the contract (:func:`rayemb.contract.model.check_model`) ->
        (model, paths of the embedding modules in it)."""
        from rayemb.contract.model import check_model, check_retrieval

        factory = _import(self.factory, "model.name") if isinstance(self.factory, str) else self.factory
        try:
            model = factory(embeddings, schema, **dict(self.args))
        except TypeError as e:
            if "argument" not in str(e):
                raise
            raise ConfigError(f"The model factory {self.name} does not take the arguments it was given "
                              f"({e}). Its signature must be `{self.name.rsplit(':', 1)[-1]}(embeddings, schema, "
                              f"**args)`, and model.args ({sorted(self.args)}) must name its keyword arguments.",
                              BAD_FACTORY) from None
        except ValueError as e:  # a factory's own check of its arguments
            raise ConfigError(f"The model factory {self.name} refused its arguments: {e}", BAD_FACTORY) from None
        paths = check_model(model, embeddings, self.name)
        check_retrieval(model, schema, self.name)
        return model, paths


def check_table_dims(model_cfg: Any, schema: Any) -> None:
    """The shipped DLRM refuses pooled vectors of another width than its bottom MLP's output (ConfigError naming
    the features and the fix), before any work: its dot interaction multiplies every pair of vectors. Other
    models take each feature's width from :attr:`~rayemb.contract.model.Embeddings.dims`."""
    if model_cfg.factory or model_cfg.name != "dlrm":
        return
    args = dict(model_cfg.args or {})
    width = int(list(args.get("bottom_mlp", model_cfg.bottom_mlp))[-1])
    dims = dict(zip(schema.pooled_features, schema.feature_dims(model_cfg.embedding_dim)))
    off = {f: d for f, d in dims.items() if d != width}
    if off:
        raise ConfigError(
            f"model.name: dlrm takes pairwise dot products of the pooled vectors and the bottom MLP's output, so "
            f"every one must be {width} wide (model.bottom_mlp's last size); schema.yaml's embedding_dim makes "
            f"features {off} other widths. Drop embedding_dim from those entries (or give every table one dim and "
            "set model.embedding_dim and model.bottom_mlp's last size to it), or use model.name: dcn_v2 or "
            "two_tower, which concatenate vectors of any width.", BAD_FACTORY)


def _import(target: str, where: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"Invalid config value {where}: {target!r} is not of the form 'package.module:function'. "
                          "Name the module and the function, e.g. 'my_models.deepfm:build'.", BAD_FACTORY)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"Invalid config value {where}: the module {module_name!r} cannot be imported ({e}). "
                          "Put its directory on PYTHONPATH (or in the job's working_dir for `ray job submit`), "
                          "or install its package.", BAD_FACTORY) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"Invalid config value {where}: the module {module_name!r} has no {attr!r}. Name a "
                              "function defined there.", BAD_FACTORY)
    if not callable(fn):
        raise ConfigError(f"Invalid config value {where}: {target!r} is a {type(fn).__name__}, not a function. Name "
                          "a function `(embeddings, schema, **args) -> nn.Module`.", BAD_FACTORY)
    _ship_by_value(module)
    return fn


def _installed(path: str) -> bool:
    """Whether a module file lives in an installed location (site-packages, the standard library, rayemb)."""
    path = os.path.realpath(path)
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # the rayemb package
    return any(path.startswith(os.path.realpath(r) + os.sep) for r in roots)


def ship_function(fn: Callable[..., Any]) -> None:
    """A factory function given as an object (the Python API): its module travels by value when not installed."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is not None and module.__name__ != "__main__":
        _ship_by_value(module)


def _ship_by_value(module: Any) -> None:
    """A module of the user's own (not installed) is pickled by value: Ray workers get its code with the job."""
    path = getattr(module, "__file__", None)
    if not path or _installed(path) or module.__name__ not in sys.modules:
        return
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)


def _search_workspace() -> None:
    """Lets ``rayemb train`` (a console script, whose path holds no working directory) import a factory from the
    job's workspace or the current directory, as ``python -m`` would."""
    from rayemb.constants import WORKSPACE_ENV_VAR

    for d in (os.environ.get(WORKSPACE_ENV_VAR), os.getcwd()):
        if d and os.path.realpath(d) not in {os.path.realpath(p or ".") for p in sys.path}:
            sys.path.append(d)


def user_loss(target: Optional[str]) -> Optional[Callable[..., Any]]:
    """The loss function ``train.loss`` names (imported, shipped to the workers as a factory is), or None."""
    if not target:
        return None
    _search_workspace()
    return _import(target, "train.loss")


def model_spec(model_cfg: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a config's ``model`` section: a factory of the user's is imported here (its
    errors found before any work starts), a shipped one where the model is built."""
    if model_cfg.factory:
        _search_workspace()
    return _resolve(model_cfg.name, model_cfg.factory, model_cfg.args,
                    {"bottom_mlp": model_cfg.bottom_mlp, "top_mlp": model_cfg.top_mlp,
                     "sequence_tower": model_cfg.sequence_tower})


def model_spec_from_json(model_json: Mapping[str, Any]) -> ModelSpec:
    """The :class:`ModelSpec` of an export's model.json ``model`` section (written from the job's config by
    :func:`rayemb.serve.model.model_config`): the model the job trained, resolved as :func:`model_spec` resolves
    the config. A factory is imported from ``sys.path`` as it is (an export's code folder put first by its loader,
    never the working directory); an export that names neither a factory nor a model is a DLRM (made before other
    models could be exported)::

        >>> spec = model_spec_from_json({"name": "two_tower", "embedding_dim": 8, "args": {"tower": [16]}})
        >>> spec.factory, dict(spec.args), spec.name
        ('rayemb.models.two_tower:two_tower', {'tower': [16]}, 'two_tower')
    """
    dlrm_keys = {k: model_json[k] for k in ("bottom_mlp", "top_mlp", "sequence_tower") if k in model_json}
    return _resolve(str(model_json.get("name") or "dlrm"), model_json.get("factory") or None,
                    model_json.get("args"), dlrm_keys)


def _resolve(name: str, factory: Optional[str], args: Optional[Mapping[str, Any]], dlrm_keys: Mapping[str, Any]
             ) -> ModelSpec:
    """A factory of the user's imported, else the shipped ``name`` (the DLRM with its layer sizes as arguments)."""
    args = dict(args or {})
    if factory:
        return ModelSpec(_import(factory, "model.factory"), args, factory)
    if name not in SHIPPED_MODELS:
        raise ConfigError(f"Invalid config value model.name: {name!r} is not a shipped model. Use one of "
                          f"{sorted(SHIPPED_MODELS)}, or name a factory 'package.module:function'.", BAD_FACTORY)
    if name == "dlrm":  # the DLRM's layer sizes have config keys of their own
        args = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in dlrm_keys.items()} | args
    return ModelSpec(SHIPPED_MODELS[name], args, name)


__all__ = ["ModelSpec", "check_table_dims", "model_spec", "model_spec_from_json", "user_loss", "ship_function", "SHIPPED_MODELS"]
