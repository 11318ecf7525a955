"""Which ``train.embedding_optimizer`` FBGEMM's fused kernels run where, checked against a job's plan.

Sharded tables (and hybrid tables' cold rows, raw-id tables, sequence tables) are updated by FBGEMM's fused
kernel of the job's embedding optimizer; fbgemm-gpu-cpu 1.8.0 has CPU kernels for row-wise Adagrad, Adagrad and
SGD, not for Adam or partial row-wise Adam (its TBE refuses them: "Optimizer adam is not supported in CPU mode").
:func:`check_embedding_optimizer` turns that into one error naming a table and its placement, in the driver once
the plan is made and again where a model is built from a plan, before any table is allocated.
Data-parallel tables use TorchRec's ``dense`` kernel: their optimizer is rayemb's
(:mod:`rayemb.train.worker.optim`), on any device.
"""

from __future__ import annotations

from typing import Any, Dict

#: ``train.embedding_optimizer`` values whose FBGEMM kernel has no CPU version (FBGEMM 1.8.0)
CUDA_ONLY_EMBEDDING_OPTIMIZERS = ("adam", "rowwise_adam")


def fused_tables(sharding_plan: Any) -> Dict[str, str]:
    """Table -> sharding type of every table of a TorchRec sharding plan that a fused FBGEMM kernel updates
    (every placement but data-parallel: sharded tables and hybrid tables' cold halves)."""
    out: Dict[str, str] = {}
    for module_plan in getattr(sharding_plan, "plan", {}).values():
        for table, ps in module_plan.items():
            if str(ps.compute_kernel).startswith("fused") or ps.compute_kernel == "key_value":
                out[table] = str(ps.sharding_type)
    return out


def check_embedding_optimizer(name: str, sharding_plan: Any, device: Any) -> None:
    """Raises :class:`~rayemb.errors.ConfigError` when ``train.embedding_optimizer`` has no FBGEMM kernel for a
    table the plan gives a fused kernel on ``device`` (Adam on CPU), naming the table, its placement and the fixes."""
    from rayemb.errors import ConfigError

    if name not in CUDA_ONLY_EMBEDDING_OPTIMIZERS or getattr(device, "type", str(device)) == "cuda":
        return
    fused = fused_tables(sharding_plan)
    if fused:
        table, placement = sorted(fused.items())[0]
        raise ConfigError(
            f"train.embedding_optimizer: {name!r} has no CPU kernel in FBGEMM; table {table!r} is placed "
            f"{placement} (a fused FBGEMM kernel), as are {len(fused) - 1} more. Train on GPUs "
            "(scaling.use_gpu: true), pin every table data-parallel (planner.tables: {T: {sharding: data_parallel}}: "
            "replicated rows take Adam's math in torch), or use rowwise_adagrad, adagrad or sgd.")


__all__ = ["CUDA_ONLY_EMBEDDING_OPTIMIZERS", "check_embedding_optimizer", "fused_tables"]
