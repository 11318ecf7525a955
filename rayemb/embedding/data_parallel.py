"""One ``DistributedDataParallel`` for all of a job's replicated parameters.

TorchRec wraps the lookup of every data-parallel sharding in a DDP of its own
(``ShardedEmbeddingBagCollection.init_data_parallel``, and the same in
``ShardedEmbeddingCollection``), next to the DDP ``DistributedModelParallel``
puts around the dense arch. A hybrid job's DLRM has three: the dense arch, the
data-parallel tables of the plain child and the hot rows of the hybrid tables.
Each is one more gradient all-reduce per step (a round trip on the links, which
``calibrate_probes.add_probes`` measures as ``ddp_step_s``) and one more set of hooks,
although the three together hold under 1 MB of gradients, one DDP bucket.

:class:`OneDataParallelWrapper` (pass it to ``DistributedModelParallel`` as
``data_parallel_wrapper``) gives the model one DDP instead: over the dense
parameters and every data-parallel lookup's parameters, one bucket while they
fit ``bucket_cap_mb``. Averaging is DDP's either way (sum / world size), so the
trained values are those of TorchRec's wrappers (``tests/dist/test_one_ddp.py``
checks it against them, step by step). Names, state dicts and checkpoints do not
change: only who all-reduces which gradient.

``allreduce_comm_precision`` (``"bf16"`` / ``"fp16"``, TorchRec's argument; the backward direction of
``train.comm_precision``) all-reduces those gradients in 16 bits through DDP's
``bf16_compress_hook`` / ``fp16_compress_hook``: on the one DDP, and on every DDP TorchRec keeps
where the wrapper leaves its own.

Example::

    >>> model = DistributedModelParallel(module, device=device, plan=plan, sharders=cpu_capable_sharders(),
    ...                                  data_parallel_wrapper=OneDataParallelWrapper())
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Iterator, List, Sequence, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

from rayemb.embedding.qcomm import compress_hook

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

logger = logging.getLogger(__name__)


def _data_parallel_lookups(model: nn.Module) -> Iterator[Tuple[list, int]]:
    """(the sharded module's ``_lookups`` list, index) of every lookup TorchRec wrapped in its own DDP.

    Sharded modules keep their lookups in a plain list (not a registered child), so ``named_modules``
    reaches the sharded module but not them.
    """
    for module in model.modules():
        lookups = module.__dict__.get("_lookups")
        if isinstance(lookups, list):
            for i, lookup in enumerate(lookups):
                if isinstance(lookup, DistributedDataParallel):
                    yield lookups, i


class _JobDataParallel(DistributedDataParallel):
    """DDP over ``module`` plus the parameters of ``replicated`` modules its module tree does not reach.

    DDP finds the parameters it reduces by walking ``module.named_modules()``; TorchRec's data-parallel
    lookups hang off sharded modules in plain lists, so they are handed over here and join the reducer's
    buckets after the module's own parameters (DDP checks their shapes across ranks). Their values are
    already equal on every rank: TorchRec's own DDP broadcast them from rank 0 when it wrapped them.
    """

    def __init__(self, module: nn.Module, replicated: Sequence[nn.Module], **kwargs) -> None:
        extra: List[Tuple[str, nn.Parameter]] = []
        seen: set = set()
        for i, m in enumerate(replicated):
            for name, p in m.named_parameters():
                if p.requires_grad and p not in seen:
                    seen.add(p)
                    extra.append((f"<data-parallel lookup {i}>.{name}", p))
        # read by the overrides below, which DDP's __init__ calls: set first, outside nn.Module's __setattr__
        object.__setattr__(self, "_rayemb_extra", extra)
        super().__init__(module, **kwargs)

    def _build_params_for_reducer(self):
        params, expect_sparse = super()._build_params_for_reducer()
        return list(params) + [p for _, p in self._rayemb_extra], list(expect_sparse) + [False] * len(self._rayemb_extra)

    def _build_debug_param_to_name_mapping(self, parameters):
        own = len(parameters) - len(self._rayemb_extra)  # the extra parameters come last
        mapping = super()._build_debug_param_to_name_mapping(parameters[:own])
        mapping.update({own + i: name for i, (name, _) in enumerate(self._rayemb_extra)})
        return mapping


class OneDataParallelWrapper(DefaultDataParallelWrapper):
    """``DistributedModelParallel``'s data-parallel wrapper: one DDP for the dense arch and every
    data-parallel lookup TorchRec would give a DDP of its own.

    Those lookups' own DDPs are taken apart (autograd hooks removed, the lookup put back unwrapped)
    and their parameters join the one DDP's buckets. A model without dense parameters keeps TorchRec's
    wrappers: there is nothing to merge them into. Keyword arguments are ``DefaultDataParallelWrapper``'s;
    ``allreduce_comm_precision`` (None, ``"bf16"``, ``"fp16"``) puts DDP's compression hook on each DDP left.
    """

    def wrap(self, dmp: "DistributedModelParallel", env: "ShardingEnv", device: torch.device) -> None:
        from torchrec.distributed.model_parallel import DistributedModelParallel

        inner = dmp._dmp_wrapped_module
        if isinstance(inner, DistributedDataParallel):
            return
        hook = compress_hook(self._allreduce_comm_precision)
        ignore = set(DistributedModelParallel._sharded_parameter_names(inner)) | self._additional_params_to_ignore
        if not set(dict(dmp.named_parameters())) - ignore:
            super().wrap(dmp, env, device)  # hooks the dense DDP, if any, itself
            if hook is not None:
                for lookups, i in _data_parallel_lookups(inner):
                    lookups[i].register_comm_hook(lookups[i].process_group, hook)
            return
        pg = env.process_group
        if pg is None:
            raise RuntimeError("OneDataParallelWrapper needs a ProcessGroup-based ShardingEnv")
        replicated = []
        for lookups, i in list(_data_parallel_lookups(inner)):
            ddp = lookups[i]
            # its reducer is never armed again (its forward no longer runs); take its hooks off the parameters
            ddp._remove_autograd_hooks()
            lookups[i] = ddp.module
            replicated.append(ddp.module)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            module=inner, params_and_buffers_to_ignore=ignore)
        dmp._dmp_wrapped_module = _JobDataParallel(
            inner.to(device),
            replicated,
            device_ids=None if device.type == "cpu" else [device],
            process_group=pg,
            gradient_as_bucket_view=True,
            broadcast_buffers=False,
            static_graph=self._static_graph,
            find_unused_parameters=self._find_unused_parameters,
            bucket_cap_mb=self._bucket_cap_mb,
            **self._ddp_kwargs,
        )
        if hook is not None:
            dmp._dmp_wrapped_module.register_comm_hook(pg, hook)
        logger.debug("one DDP for the dense arch and %d data-parallel lookups", len(replicated))


def replicated_embedding_parameters(model: nn.Module) -> Dict[str, nn.Parameter]:
    """Embedding parameters DMP left dense and data-parallel (hybrid hot halves, data-parallel tables).

    TorchRec fuses the optimizer of sharded tables into their backward, but
    data-parallel tables use the ``dense`` kernel: their DDP-averaged gradients
    need a regular optimizer, normally of the same kind as the fused one
    (e.g. ``torchrec.optim.RowWiseAdagrad``). Call after ``DistributedModelParallel``.
    """
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return {
        n: p for n, p in in_backward_optimizer_filter(model.named_parameters())
        if ".embedding_bags." in f".{n}" or ".embeddings." in f".{n}"
    }


__all__ = ["OneDataParallelWrapper", "replicated_embedding_parameters"]
