"""A job's pooled embedding module from its plan: per table, the placement the planner chose.

:func:`hybrid_from_placements` turns per-table placements (``PlanResult.tables``,
:class:`rayemb.planner.types.TablePlan`) and the split's hot ids into the
:class:`~rayemb.embedding.hybrid.HybridEmbeddingBagCollection` the job trains,
and the TorchRec ``ParameterConstraints`` that keep TorchRec's planner to those
placements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from rayemb.embedding.compression_math import CompressionSpec, storage_spec
from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
from rayemb.errors import ConfigError

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ParameterConstraints


def hybrid_from_placements(
    tables: Sequence[EmbeddingBagConfig],
    placements: Mapping[str, object],
    hot_ids: Mapping[str, np.ndarray],
    is_weighted: bool = False,
    device: Optional[torch.device] = None,
    raw: Sequence[Any] = (),
) -> Tuple[HybridEmbeddingBagCollection, Dict[str, "ParameterConstraints"]]:
    """Module + planner constraints from per-table placements (e.g. ``PlanResult.tables``).

    ``placements[name]`` has ``.placement`` (``"hybrid"`` or a TorchRec
    sharding type, str or enum) and ``.sharding_type`` (for hybrid tables:
    the cold half's type), like :class:`rayemb.planner.types.TablePlan`.
    Hybrid tables take their hot ids from ``hot_ids`` (e.g.
    ``FrequentSplit.hot_ids(name)``); the others stay plain, constrained to
    their sharding type. Tables absent from ``placements`` are plain and
    unconstrained. ``raw``: the schema's raw-id features, whose tables go to the raw child (row-wise); one
    placed hybrid keeps its hot ids (raw values) in the hot child.
    """
    hybrid_hot: Dict[str, np.ndarray] = {}
    cold_types: Dict[str, str] = {}
    plain_types: Dict[str, List[str]] = {}
    compression: Dict[str, CompressionSpec] = {}
    data_parallel: List[str] = []
    raw_tables = {f.name for f in raw}
    for t in tables:
        tp = placements.get(t.name)
        if tp is None:
            continue
        placement = str(getattr(getattr(tp, "placement"), "value", getattr(tp, "placement")))
        if t.name in raw_tables:  # its managed rows go to the raw child; a hybrid one's hot ids to the hot child
            if placement == "hybrid":
                hybrid_hot[t.name] = hot_ids.get(t.name, np.zeros(0, np.int64))
            continue
        sharding_type = str(getattr(getattr(tp, "sharding_type"), "value", getattr(tp, "sharding_type")))
        spec = storage_spec(getattr(tp, "storage", None))
        if spec.compressed:
            if placement == "hybrid":
                raise ConfigError(f"Table {t.name!r} is placed hybrid and stored {spec.kind}; a compressed "
                                  "table cannot be hybrid. Drop one of the two pins.", category="invalid_option")
            compression[t.name] = spec
        if placement == "data_parallel":
            data_parallel.append(t.name)
        if placement == "hybrid":
            if t.name not in hot_ids:
                raise ConfigError(
                    f"Table {t.name!r} is placed hybrid but no hot ids were given for it. "
                    "Pass the split's hot ids (FrequentSplit.hot_ids) for every hybrid table."
                )
            hybrid_hot[t.name] = hot_ids[t.name]
            cold_types[t.name] = sharding_type
        else:
            plain_types[t.name] = [sharding_type]
    module = HybridEmbeddingBagCollection(tables, hybrid_hot, is_weighted=is_weighted, device=device,
                                          compression=compression, data_parallel=data_parallel, raw=raw)
    return module, module.parameter_constraints(cold_types, plain_types)


__all__ = ["hybrid_from_placements"]
