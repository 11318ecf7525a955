"""A sweep's search space: ``space.yaml`` maps config keys to how each is searched.

Each key of the job config (``train.dense_lr``, ``model.embedding_dim``, ``model.args.hidden``, ...) takes exactly
one of five forms, Ray Tune's sampling functions of the same names::

    model.embedding_dim: {grid: [8, 16, 32]}         # every value, each run --num-samples times
    model.args.hidden: {choice: [[64, 32], [32, 16]]} # one value per trial, uniformly
    train.dense_lr: {loguniform: [0.001, 0.3]}        # a float, uniform in log space
    train.weight_decay: {uniform: [0.0, 0.01]}        # a float
    data.batch_size: {randint: [128, 513]}            # an integer, lo <= n < hi (hi excluded, as in Tune)

A swept ``model.embedding_dim`` carries the shipped DLRM's bottom MLP along (:func:`with_carried`): where the base
config's ``model.bottom_mlp`` ends at its embedding dim and ``model.bottom_mlp`` is not swept itself, each trial's
bottom MLP ends at that trial's embedding dim (the dot interaction needs them equal).

Before any trial starts, :func:`check_space` builds the job config with every grid and choice value and with both
ends of every range, so a value the config refuses (an unknown key, a wrong type, a bound outside its range) stops
the sweep with one message naming the key and the fix.

Example::

    >>> space = parse_space({"train.dense_lr": {"grid": [0.1, 0.01]}})
    >>> space["train.dense_lr"].kind, space["train.dense_lr"].values
    ('grid', (0.1, 0.01))
    >>> override("model.args.hidden", [64, 32])
    'model.args.hidden=[64, 32]'
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import yaml

from rayemb.config import JobConfig, ModelConfig, config_from_dict
from rayemb.errors import ConfigError

#: the forms a key's entry takes: a list of values, or a range [lo, hi]
LISTS = ("grid", "choice")
RANGES = ("uniform", "loguniform", "randint")
SPACE_KINDS = LISTS + RANGES
#: keys the sweep sets itself for each trial: its name, output folder and MLflow store
RESERVED = ("name", "tracking")
#: the ``ConfigError`` category of a bad space
INVALID_SPACE = "invalid_sweep_space"
#: a swept embedding dim carries the DLRM's bottom MLP's last width (:func:`with_carried`)
EMBEDDING_DIM, BOTTOM_MLP = "model.embedding_dim", "model.bottom_mlp"

_FORMS = ("{grid: [v1, v2, ...]}, {choice: [v1, v2, ...]}, {uniform: [lo, hi]}, {loguniform: [lo, hi]} or "
          "{randint: [lo, hi]}")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched config key: its form (one of :data:`SPACE_KINDS`) and its values or range."""

    key: str
    kind: str
    values: Tuple[Any, ...]

    def checked_values(self) -> Tuple[Any, ...]:
        """The values a config is built with to check this key: all of a list, both ends of a range."""
        if self.kind in LISTS:
            return self.values
        lo, hi = self.values
        return (lo, hi - 1) if self.kind == "randint" else (lo, hi)

    def tune(self) -> Any:
        """Ray Tune's sampler (or ``grid_search``) of this key."""
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return getattr(tune, self.kind)(*self.values)


def _bad(where: str, key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{where} {key}: {problem}. {fix}", category=INVALID_SPACE)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _dimension(key: Any, entry: Any, where: str) -> Dimension:
    if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
        raise _bad(where, repr(key), "is not a config key", "Name a key as section.key, e.g. train.dense_lr.")
    if key.split(".")[0] in RESERVED:
        raise _bad(where, key, "is set by the sweep for each trial (its name, output folder and MLflow store)",
                   "Set it in the config or with --set; sweep other keys.")
    if not isinstance(entry, Mapping) or len(entry) != 1 or next(iter(entry)) not in SPACE_KINDS:
        raise _bad(where, key, f"{entry!r} is not one search form", f"Write exactly one of {_FORMS}.")
    kind, values = next(iter(entry.items()))
    if not isinstance(values, list) or not values:
        raise _bad(where, key, f"{kind} takes a non-empty list, not {values!r}", f"Write {{{kind}: [...]}}.")
    if kind in LISTS:
        dumped = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(dumped)) != len(dumped):
            raise _bad(where, key, f"{kind} {values} repeats a value, which would run the same job twice",
                       "Give each value once.")
        return Dimension(key, kind, tuple(values))
    if len(values) != 2 or not all(_number(v) for v in values) or not values[0] < values[1]:
        raise _bad(where, key, f"{kind} {values} is not a range [lo, hi] of two numbers with lo < hi",
                   f"Write {{{kind}: [lo, hi]}}, e.g. {{{kind}: [1, 10]}}.")
    if kind == "loguniform" and values[0] <= 0:
        raise _bad(where, key, f"loguniform {values} starts at {values[0]}, and a log scale needs lo > 0",
                   "Use a positive lo, or uniform for a range that starts at 0.")
    if kind == "randint" and not all(isinstance(v, int) for v in values):
        raise _bad(where, key, f"randint {values} is not two integers",
                   "Write integers: {randint: [lo, hi]} draws lo <= n < hi; use uniform for floats.")
    return Dimension(key, kind, tuple(values))


def parse_space(doc: Any, where: str = "space.yaml") -> Dict[str, Dimension]:
    """Reads a space mapping (``{key: {kind: values}}``); a malformed entry raises :class:`ConfigError`."""
    if not isinstance(doc, Mapping) or not doc:
        raise ConfigError(f"{where} must map config keys to search forms, e.g. "
                          "'train.dense_lr: {loguniform: [0.001, 0.1]}'; it holds " + repr(doc)[:200] + ".",
                          category=INVALID_SPACE)
    return {str(k): _dimension(k, v, where) for k, v in doc.items()}


def load_space(path: str) -> Dict[str, Dimension]:
    """Reads ``space.yaml``; a missing, unreadable or malformed file raises :class:`ConfigError`."""
    if not os.path.isfile(path):
        raise ConfigError(f"Space file {path!r} does not exist. Pass --space with a YAML file that maps config keys "
                          f"to search forms ({_FORMS}).", category=INVALID_SPACE)
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"Space file {path!r} is not valid YAML: {e}. Fix the syntax at the position shown.",
                          category=INVALID_SPACE) from None
    return parse_space(doc, where=path)


def override(key: str, value: Any) -> str:
    """A ``--set`` override of ``key`` to ``value`` (JSON, which YAML reads back as the same value)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict)):  # a numpy scalar Tune sampled
        value = value.item()
    return f"{key}={json.dumps(value)}"


def trial_overrides(space_keys: Sequence[str], trial_config: Mapping[str, Any]) -> List[str]:
    """The overrides of one trial: its value of every searched key."""
    return [override(k, trial_config[k]) for k in space_keys if k in trial_config]


def with_carried(base: Mapping[str, Any], values: Mapping[str, Any], swept: Sequence[str] = ()) -> Dict[str, Any]:
    """``values`` (config key to value) with what they carry along in ``base`` (a config mapping).

    The shipped DLRM's bottom MLP must end at the embedding dim, and a space's keys are crossed, so the two could
    never move together: a value of ``model.embedding_dim`` replaces the last width of ``model.bottom_mlp`` where
    the base's bottom MLP ends at the base's embedding dim and ``model.bottom_mlp`` is neither among ``values``
    nor ``swept`` (the space's keys): a bottom MLP swept or ended elsewhere on purpose is left as it is, and the
    config checks it."""
    out = dict(values)
    dim = out.get(EMBEDDING_DIM)
    if hasattr(dim, "item") and not isinstance(dim, (list, dict)):  # a numpy integer Tune sampled
        dim = dim.item()
    if BOTTOM_MLP in out or BOTTOM_MLP in swept or not isinstance(dim, int) or isinstance(dim, bool):
        return out
    model = base.get("model") or {}
    if not isinstance(model, Mapping) or model.get("factory") or model.get("name", "dlrm") != "dlrm":
        return out
    defaults = ModelConfig()
    bottom = model.get("bottom_mlp", list(defaults.bottom_mlp))
    if isinstance(bottom, (list, tuple)) and bottom and bottom[-1] == model.get("embedding_dim",
                                                                                 defaults.embedding_dim):
        out[BOTTOM_MLP] = [*bottom[:-1], dim]
    return out


def check_space(space: Mapping[str, Dimension], base: Mapping[str, Any], where: str = "space.yaml") -> List[JobConfig]:
    """Builds the job config from ``base`` (a config mapping) with each checked value of each key, one key at a
    time; returns the configs built. A value the config refuses raises :class:`ConfigError` naming the key."""
    built = []
    for key, dim in space.items():
        for value in dim.checked_values():
            try:
                carried = with_carried(base, {key: value}, swept=list(space))
                built.append(config_from_dict(dict(base), [override(k, v) for k, v in carried.items()]))
            except ConfigError as e:
                inner = e.message.rstrip(".")
                if "Unknown config key" in inner or "is not a section" in inner:
                    raise _bad(where, key, f"is not a config key ({inner})",
                               "Search keys the config has (docs/config.md), e.g. train.dense_lr.") from None
                what = "value" if dim.kind in LISTS else ("bound" if dim.kind != "randint" else "bound (hi - 1)")
                raise _bad(where, key, f"the config refuses the {dim.kind} {what} {value!r} ({inner})",
                           f"Fix or remove that {what.split()[0]}.") from None
    return built


__all__ = ["Dimension", "SPACE_KINDS", "parse_space", "load_space", "check_space", "override", "trial_overrides",
           "with_carried"]
