"""docs/config.md is the configuration reference rendered from rayemb/config.py, and it lists every key.

A key added to a config dataclass, a default changed or an allowed value added changes :func:`render`; the
committed page must then be regenerated, so the reference a user reads is the code's.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from rayemb import config
from rayemb.config_reference import REGENERATE, field_comments, render, section_keys, sections, type_name

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "config.md"


def test_the_committed_page_is_what_render_writes():
    assert PAGE.is_file(), f"docs/config.md is missing: run `{REGENERATE}` from the repository root"
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/config.md is stale against rayemb/config.py: run `{REGENERATE}` from the repository root "
        "and commit the page")


def test_every_field_of_every_section_is_listed_with_its_default_and_a_description():
    page = render()
    listed = 0
    for name, cls, description in sections():
        assert name is None or f"## `{name}`" in page
        assert name is None or description, f"JobConfig.{name} has no `#:` comment to describe its section"
        for f in dataclasses.fields(cls):
            path = f"{name}.{f.name}" if name else f.name
            if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
                continue
            row = next((line for line in page.splitlines() if line.startswith(f"| `{path}` |")), None)
            assert row is not None, f"{path} is not in the reference"
            assert field_comments(cls)[f.name], (
                f"{cls.__name__}.{f.name} has no `#:` comment: add one above the field saying what it sets")
            listed += 1
    fields = sum(len(dataclasses.fields(c)) for _, c, _ in sections()) - (len(sections()) - 1)
    assert listed == fields > 50  # the sections really were read


def test_allowed_values_are_the_constants_the_validation_checks():
    keys = {k.path: k for _, cls, _ in sections() for k in section_keys(cls, "" if cls is config.JobConfig
                                                                          else _prefix(cls))}
    for path, allowed in config.CHOICES.items():
        assert path in keys, f"config.CHOICES names {path}, which no config dataclass has"
        assert keys[path].allowed == tuple(allowed)
    assert keys["model.name"].allowed == ("dlrm", "dcn_v2", "two_tower")
    assert keys["train.precision"].allowed == ("fp32", "bf16")
    assert keys["model.sequence_tower"].allowed == ("none", "mean", "attention")


def test_types_and_defaults_read_as_yaml():
    keys = {k.path: k for k in section_keys(config.ModelConfig, "model.")}
    assert (keys["model.bottom_mlp"].type, keys["model.bottom_mlp"].default) == ("list of integer", "[64, 16]")
    assert (keys["model.factory"].type, keys["model.factory"].default) == ("string or null", "null")
    assert type_name(typing.Dict[str, float]) == "mapping of string to number"
    data = {k.path: k for k in section_keys(config.DataConfig, "data.")}
    assert data["data.path"].default == "required"


def _prefix(cls: type) -> str:
    return next(f"{name}." for name, c, _ in sections() if c is cls)
