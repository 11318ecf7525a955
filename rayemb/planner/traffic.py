"""Traffic model: bytes one table moves per training step under each placement, by collective.

Bytes are *sent off-rank, summed over all ranks*, forward + backward — the
convention :mod:`rayemb.embedding.comm` measures with: an all-reduce of N
bytes costs 2·(W-1)·N (ring: each rank sends 2·N·(W-1)/W), an all-to-all
sends every chunk not addressed to its own rank, a reduce-scatter /
all-gather whose full tensor holds N bytes per rank costs (W-1)·N. With
global batch B, dim D, element size s, P ids per bag, hot share h, rows V,
hot rows |F|, devices per node L, and uniform traffic (a share q = (W-1)/W of
ids and rows leave their rank):

=================  ==========================================================
data_parallel      all-reduce 2·(W-1)·V·D·s
table_wise         ids q·B·P·id + lengths q·B·len, pooled rows 2·q·B·D·s
row_wise           ids q·B·P·id + lengths (W-1)·B·len (every rank gets every
                   bag's length), reduce-scatter (W-1)·B·D·s, all-gather (W-1)·B·D·s
column_wise (k)    k x (ids + lengths) of table_wise, pooled rows 2·q·B·D·s
table_column_wise  as column_wise
table_row_wise     ids q·B·P·id + lengths max(L-1, 1)·B·len, reduce-scatter and
                   all-gather (L-1)·B·D·s inside one node, pooled rows 2·q·B·D·s across
hybrid             all-reduce 2·(W-1)·|F|·D·s, cold ids q·(1-h)·B·P·id + lengths
                   (q·B·len table-wise cold, (W-1)·B·len row-wise cold; k-fold for
                   k column shards), cold rows 2·q·(1-h)·B·P·D·s
=================  ==========================================================

Lengths are int32 (``len`` = 4 bytes), as :mod:`rayemb.data.batching` and the
hybrid remapper make them; ids are int64. Metadata all-to-alls (per-rank split sizes, W·(W-1)·features·8 bytes) are
included except for table_row_wise; weighted features add 4 bytes per
exchanged id. The all-reduced replicated rows' gradients have the weights'
element size (``grad_elem_bytes``: 2 for fp16 tables); exchanged rows are
TorchRec's lookup outputs, fp32 whatever the tables' dtype (:data:`OUTPUT_ELEM_BYTES`).
DP/TW/RW/CW and hybrid are checked against measured collective
bytes by ``jobs/bench/hybrid_comm.py`` (docs/benchmarks.md); table_row_wise is an
estimate with no measured counterpart yet. The hybrid rule follows HugeCTR's
hybrid embedding cost model (frequent rows all-reduced, infrequent rows
exchanged per id). Pure: no torch.

Example::

    >>> predict_table_bytes("data_parallel", batch_size=1024, dim=16, world_size=4, pooling=1.0, num_rows=1000)
    {'all_reduce': 384000.0}
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Union

from rayemb.errors import ConfigError
from rayemb.planner.types import HYBRID_COLD_PLACEMENTS, Placement

#: bytes per element of the rows the all-to-alls and reduce-scatters move: FBGEMM's lookups output fp32 for
#: fp16 tables too (TorchRec's ``output_dtype`` fused param defaults to FP32)
OUTPUT_ELEM_BYTES = 4


def _placement(value: Union[str, Placement], what: str, allowed: Sequence[Placement]) -> Placement:
    try:
        p = Placement(value)
    except ValueError:
        p = None
    if p not in allowed:
        raise ConfigError(f"Unknown {what} {value!r}; use one of {[a.value for a in allowed]}.")
    return p


def predict_table_bytes(
    placement: Union[str, Placement],
    *,
    batch_size: int,
    dim: int,
    world_size: int,
    pooling: float,
    num_rows: int,
    hot_share: float = 0.0,
    num_hot: int = 0,
    num_features: int = 1,
    elem_bytes: int = OUTPUT_ELEM_BYTES,
    grad_elem_bytes: Optional[int] = None,
    id_bytes: int = 8,
    length_bytes: int = 4,
    weighted: bool = False,
    column_shards: int = 1,
    devices_per_node: int = 1,
    cold_sharding: Union[str, Placement] = Placement.ROW_WISE,
) -> Dict[str, float]:
    """Predicted bytes per training step (forward + backward) of one table, by collective (module docstring).

    ``column_shards`` is k for column-wise placements (and column-wise hybrid
    cold halves); ``devices_per_node`` is L for table_row_wise; ``grad_elem_bytes``
    the element size of the all-reduced replicated rows (None: ``elem_bytes``);
    ``cold_sharding`` is the sharding of a hybrid table's cold half. Raises
    :class:`ConfigError` for an unknown placement.
    """
    p = _placement(placement, "placement", tuple(Placement))
    w, b, d, s = world_size, float(batch_size), dim, elem_bytes
    g = s if grad_elem_bytes is None else grad_elem_bytes
    q = (w - 1) / w
    idb = id_bytes + (4 if weighted else 0)
    meta = w * (w - 1) * num_features * 8.0
    n_ids = b * pooling * num_features
    bags = b * num_features
    if p == Placement.DATA_PARALLEL:
        return {"all_reduce": 2.0 * (w - 1) * num_rows * d * g}
    if p == Placement.TABLE_WISE:
        return {"all_to_all": q * n_ids * idb + q * bags * length_bytes + meta + 2.0 * q * bags * d * s}
    if p in (Placement.COLUMN_WISE, Placement.TABLE_COLUMN_WISE):
        k = column_shards
        return {"all_to_all": k * (q * n_ids * idb + q * bags * length_bytes + meta) + 2.0 * q * bags * d * s}
    if p == Placement.ROW_WISE:
        rs = (w - 1) * bags * d * s
        return {"all_to_all": q * n_ids * idb + (w - 1) * bags * length_bytes + meta,
                "reduce_scatter": rs, "all_gather": rs}
    if p == Placement.TABLE_ROW_WISE:
        # ids/lengths go to the L ranks of one node, partial pools are reduce-scattered (and all-gathered)
        # inside the node, then pooled rows cross nodes table-wise
        l = max(1, min(devices_per_node, w))
        intra = (l - 1) * bags * d * s
        return {"all_to_all": q * n_ids * idb + max(l - 1, 1) * bags * length_bytes + 2.0 * q * bags * d * s,
                "reduce_scatter": intra, "all_gather": intra}
    cold = _placement(cold_sharding, "cold sharding of a hybrid table", HYBRID_COLD_PLACEMENTS)
    cold_ids = (1.0 - hot_share) * n_ids
    out = {"all_reduce": 2.0 * (w - 1) * num_hot * d * g} if num_hot else {}
    if num_hot >= num_rows:
        return out
    if cold == Placement.ROW_WISE:
        lookup = q * cold_ids * idb + (w - 1) * bags * length_bytes + meta
    elif cold == Placement.TABLE_WISE:
        lookup = q * cold_ids * idb + q * bags * length_bytes + meta
    else:
        lookup = column_shards * (q * cold_ids * idb + q * bags * length_bytes + meta)
    out["all_to_all"] = lookup + 2.0 * q * cold_ids * d * s
    return out


def predict_bytes_per_step(tables: Sequence[Mapping[str, object]]) -> Dict[str, float]:
    """Sum of :func:`predict_table_bytes` over tables (each a kwargs mapping with ``placement``)."""
    total: Dict[str, float] = {}
    for spec in tables:
        kw = dict(spec)
        placement = kw.pop("placement")
        for k, v in predict_table_bytes(placement, **kw).items():  # type: ignore[arg-type]
            total[k] = total.get(k, 0.0) + v
    return total


__all__ = ["OUTPUT_ELEM_BYTES", "predict_table_bytes", "predict_bytes_per_step"]
