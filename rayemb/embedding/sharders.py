"""Sharders that allow every TorchRec sharding type on CPU/gloo.

TorchRec 1.8 gates row-wise (``row_wise``), table-row-wise (``table_row_wise``)
and grid sharding of an ``EmbeddingBagCollection`` to CUDA in
``BaseEmbeddingSharder.sharding_types(compute_device_type)``, although the CPU
path (FBGEMM CPU TBE kernels + gloo all-to-all / reduce-scatter) runs them
correctly; ``tests/dist/test_sharding_types.py`` checks every type against an
unsharded model to 1e-5. These subclasses lift the gate so the planner can
propose RW/TWRW on CPU clusters and the CPU test suite exercises the same
sharding types as a GPU run.

``comm_precision`` (``train.comm_precision``) puts TorchRec's quantized-comm
codecs on the sharded tables' float exchanges, on CPU and GPU alike
(:mod:`rayemb.embedding.qcomm`).

Example::

    >>> from torchrec.distributed.model_parallel import DistributedModelParallel
    >>> model = DistributedModelParallel(ebc, sharders=cpu_capable_sharders(), plan=plan)
"""

from __future__ import annotations

from typing import List, Mapping, Union

from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingType

from rayemb.embedding.qcomm import CommPrecision, qcomm_codecs_registry

#: sharding types TorchRec only offers on CUDA that also work on CPU with gloo
_CPU_UNGATED = (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value)


class CpuCapableEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollectionSharder`` that also offers ROW_WISE and TABLE_ROW_WISE on CPU.

    Only the advertised set changes; kernels, fused params and the sharded
    module are TorchRec's. On CUDA the answer equals the parent's.
    """

    def sharding_types(self, compute_device_type: str) -> List[str]:
        types = list(super().sharding_types(compute_device_type))
        types += [t for t in _CPU_UNGATED if t not in types]
        return types


def cpu_capable_sharders(comm_precision: Union[None, CommPrecision, Mapping[str, str]] = None
                         ) -> List[ModuleSharder]:
    """The sharders to pass to ``DistributedModelParallel`` / ``EmbeddingShardingPlanner.plan`` (the only list).

    They shard plain ``EmbeddingBagCollection`` s and every half of a
    ``HybridEmbeddingBagCollection`` alike, on CPU and GPU.

    TorchRec's ``EmbeddingCollectionSharder`` already offers data_parallel,
    table_wise, column_wise and row_wise on CPU (its sharded module has no
    TWRW/TWCW implementation), so it is used as is.

    ``comm_precision``: ``train.comm_precision`` (None: fp32 both ways, TorchRec's plain exchanges); the
    pooled all-to-alls, reduce-scatters and sequence all-to-alls of both sharders then go through
    :func:`~rayemb.embedding.qcomm.qcomm_codecs_registry`'s codecs.
    """
    codecs = qcomm_codecs_registry(comm_precision)
    return [CpuCapableEmbeddingBagCollectionSharder(qcomm_codecs_registry=codecs),
            EmbeddingCollectionSharder(qcomm_codecs_registry=codecs)]


__all__ = [
    "CpuCapableEmbeddingBagCollectionSharder",
    "cpu_capable_sharders",
]
