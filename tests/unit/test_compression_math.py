"""Shapes and bytes of QR and block tables (rayemb.embedding.compression_math), torch-free.

Reference size (the one ``jobs/bench/compression.py`` checks): V = 1,048,576 rows, D = 512, fp32, E_b = 128:
plain 2048 MiB, block 512 MiB (+ 256 KiB projection), QR 4 MiB (≤ 8 MiB).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rayemb.embedding.compression_math import (
    CompressionSpec,
    compressed_bytes,
    compression_ratio,
    physical_tables,
    projection_bytes,
    projection_shape,
    qr_buckets,
    qr_dims,
    qr_rows,
)
from rayemb.errors import ConfigError
from rayemb.units import MIB_BYTES

V, D, E_B = 1_048_576, 512, 128


def test_reference_sizes_in_mib() -> None:
    assert compressed_bytes(V, D, CompressionSpec()) == 2048 * MIB_BYTES
    assert compressed_bytes(V, D, CompressionSpec("block", block_dim=E_B)) == 512 * MIB_BYTES
    assert projection_bytes(D, CompressionSpec("block", block_dim=E_B)) == E_B * D * 4 == 256 * 1024
    for combine in ("mult", "add"):
        assert compressed_bytes(V, D, CompressionSpec("qr", combine=combine)) == 4 * MIB_BYTES
    assert compressed_bytes(V, D, CompressionSpec("qr", combine="concat")) == 2 * MIB_BYTES
    assert max(compressed_bytes(V, D, CompressionSpec("qr", combine=c)) for c in ("mult", "add", "concat")) \
        <= 8 * MIB_BYTES
    assert compressed_bytes(V, D, CompressionSpec(), elem_bytes=2) == 1024 * MIB_BYTES  # fp16
    assert compression_ratio(V, D, CompressionSpec("qr")) == 512.0
    assert 3.99 < compression_ratio(V, D, CompressionSpec("block", block_dim=E_B)) < 4.0  # the projection counts


@pytest.mark.parametrize("rows,m", [(1, 1), (2, 2), (4, 2), (5, 3), (40, 7), (49, 7), (50, 8), (V, 1024),
                                    (V + 1, 1025)])
def test_default_buckets_are_ceil_sqrt(rows: int, m: int) -> None:
    assert qr_buckets(rows) == m
    q, r = qr_rows(rows)
    assert r == m and q == -(-rows // m) and (q - 1) * m < rows <= q * m  # every id has one (q, r) pair


def test_explicit_buckets_and_dims() -> None:
    assert qr_rows(30, 4) == (8, 4)
    assert qr_rows(25, 25) == (1, 25)
    assert qr_dims(8, "mult") == qr_dims(8, "add") == (8, 8)
    assert qr_dims(8, "concat") == (4, 4)
    tables = physical_tables(36, 16, CompressionSpec("qr", combine="concat"))
    assert [(t.suffix, t.rows, t.dim) for t in tables] == [("__q", 6, 8), ("__r", 6, 8)]
    assert [(t.suffix, t.rows, t.dim) for t in physical_tables(50, 16, CompressionSpec("block", block_dim=4))] == [
        ("__block", 50, 4)]
    assert [(t.suffix, t.rows, t.dim) for t in physical_tables(50, 16, CompressionSpec())] == [("", 50, 16)]
    assert projection_shape(16, CompressionSpec("block", block_dim=4)) == (4, 16)
    assert projection_shape(16, CompressionSpec("qr")) is None and projection_bytes(16, CompressionSpec("qr")) == 0


@pytest.mark.parametrize("kwargs", [
    dict(kind="lsh"),
    dict(kind="qr", combine="max"),
    dict(kind="qr", buckets=0),
    dict(kind="qr", buckets=2.5),
    dict(kind="block"),
    dict(kind="block", block_dim=0),
    dict(kind="none", buckets=4),
    dict(kind="qr", block_dim=4),
])
def test_invalid_specs_raise_config_errors(kwargs) -> None:
    with pytest.raises(ConfigError) as e:
        CompressionSpec(**kwargs)
    assert e.value.category == "invalid_option"


@pytest.mark.parametrize("spec,rows,dim,needle", [
    (CompressionSpec("qr", combine="concat"), 100, 7, "even"),
    (CompressionSpec("qr", buckets=200), 100, 8, "buckets"),
    (CompressionSpec("block", block_dim=16), 100, 8, "block_dim"),
])
def test_specs_that_do_not_fit_the_table(spec: CompressionSpec, rows: int, dim: int, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as e:
        spec.check_table("C1", rows, dim)
    assert "C1" in str(e.value) and e.value.category == "invalid_option"
    CompressionSpec("qr", combine="concat").check_table("C1", 100, 8)  # fits: no error


def test_imports_without_torch() -> None:
    """The planner imports these helpers and must stay torch-free."""
    code = ("import sys, rayemb.embedding.compression_math; "
            "sys.exit(1 if 'torch' in sys.modules or 'torchrec' in sys.modules else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert p.returncode == 0
