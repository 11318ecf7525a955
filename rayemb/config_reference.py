"""The configuration reference (docs/config.md), generated from the config dataclasses of :mod:`rayemb.config`.

Every key of every section comes from the dataclass fields: the type from the annotation, the default from the
field, the allowed values from :data:`rayemb.config.CHOICES` (the constants the validation checks against) and
the description from the ``#:`` comment above the field. Nothing is written by hand, so the page cannot drift
from the code: ``tests/unit/test_config_reference.py`` checks that the committed page is what :func:`render`
returns.

Example::

    python -m rayemb.config_reference > docs/config.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from typing import Any, Dict, List, Optional, Tuple

from rayemb import config

#: the command that writes docs/config.md (named by the test when the page is stale)
REGENERATE = "python -m rayemb.config_reference > docs/config.md"

#: keys whose annotation is wider than what the validation accepts
TYPE_NOTES = {"scaling.num_workers": "integer, or [min, max]"}

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key as the reference lists it."""

    #: dotted path as ``--set`` takes it: ``train.epochs``
    path: str
    type: str
    #: the default as YAML writes it, or ``required``
    default: str
    allowed: Tuple[Any, ...]
    description: str


def field_comments(cls: type) -> Dict[str, str]:
    """The ``#:`` comment lines right above each field of ``cls``, joined into one sentence per field."""
    source = textwrap.dedent(inspect.getsource(cls))
    tree = ast.parse(source)
    source = source.splitlines()
    out = {}
    for stmt in tree.body[0].body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        comment: List[str] = []
        row = stmt.lineno - 2
        while row >= 0 and source[row].strip().startswith("#:"):
            comment.insert(0, source[row].strip()[2:].strip())
            row -= 1
        out[stmt.target.id] = " ".join(comment)
    return out


def type_name(hint: Any) -> str:
    """A YAML reader's name for an annotation: ``Optional[int]`` -> ``integer or null``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        named = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        value = type_name(args[1])
        return "mapping" if value == "any" else f"mapping of {type_name(args[0])} to {value}"
    if dataclasses.is_dataclass(hint):
        return "section"
    return _SCALARS.get(hint, getattr(hint, "__name__", str(hint)))


def yaml_value(value: Any) -> str:
    """A default as it is written in a job's YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return yaml_value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "(section)" if dataclasses.is_dataclass(value) else yaml_value(value)
    return "required"


def _choices() -> Dict[str, Tuple[Any, ...]]:
    from rayemb.contract.factory import SHIPPED_MODELS

    return {**config.CHOICES, "model.name": tuple(SHIPPED_MODELS)}


def section_keys(cls: type, prefix: str = "") -> List[Key]:
    """Every field of one config dataclass, in declaration order."""
    hints, comments, choices = typing.get_type_hints(cls), field_comments(cls), _choices()
    keys = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        keys.append(Key(path, TYPE_NOTES.get(path, type_name(hints[f.name])), _default(f),
                        tuple(choices.get(path, ())), comments.get(f.name, "")))
    return keys


def sections() -> List[Tuple[Optional[str], type, str]]:
    """(section name or None for the top level, its dataclass, its description), in the order a config has them."""
    hints, comments = typing.get_type_hints(config.JobConfig), field_comments(config.JobConfig)
    out: List[Tuple[Optional[str], type, str]] = [(None, config.JobConfig, "")]
    for f in dataclasses.fields(config.JobConfig):
        if dataclasses.is_dataclass(hints[f.name]):
            out.append((f.name, hints[f.name], comments.get(f.name, "")))
    return out


def _cell(text: str) -> str:
    """Markdown table cell: the comments' ``rst`` literals as code, pipes escaped."""
    return re.sub(r"``(.+?)``", r"`\1`", text).replace("|", "\\|")


def _table(keys: List[Key], skip_sections: bool) -> List[str]:
    rows = ["| key | type | default | allowed values | what it sets |", "|---|---|---|---|---|"]
    for k in keys:
        if skip_sections and k.type == "section":
            continue
        allowed = ", ".join(f"`{yaml_value(v)}`" for v in k.allowed)
        default = k.default if k.default in ("required", "(section)") else f"`{k.default}`"
        rows.append(f"| `{k.path}` | {k.type} | {default} | {allowed} | {_cell(k.description)} |")
    return rows


def render() -> str:
    """docs/config.md: every key of a job config with its type, default, allowed values and meaning."""
    out = [
        "# Configuration reference",
        "",
        "<!-- generated from rayemb/config.py by `" + REGENERATE + "`: edit the dataclasses' `#:` comments, "
        "not this page -->",
        "",
        "Every key a job config takes: the YAML of `rayemb train --config JOB.yaml` and `jobs/train.py`, a "
        "`--set section.key=value` override, or a section given as a mapping to `rayemb.EmbeddingTrainer` "
        "(`train={\"epochs\": 2}`). A config holds a `name`, a `data` section and any of the other sections; "
        "a key left out takes its default. An unknown key, a value of the wrong type or one outside its allowed "
        "values stops the job before any work with a `ConfigError` naming the key and the fix. "
        "[jobs/configs/synth_small.yaml](../jobs/configs/synth_small.yaml) is a complete example.",
        "",
        "A type ending in `or null` takes YAML's `null` (Python's `None`); the key's description says what null "
        "means there.",
        "",
    ]
    for name, cls, description in sections():
        out.append(f"## `{name}`" if name else "## Top level")
        out.append("")
        if description:
            out += [_cell(description[0].upper() + description[1:]) + ".", ""]
        out += _table(section_keys(cls, f"{name}." if name else ""), skip_sections=name is None)
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
