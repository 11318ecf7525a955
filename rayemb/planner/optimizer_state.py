"""Optimizer state an embedding row keeps, per ``train.embedding_optimizer``: what the planner's memory counts.

Sharded rows (and hybrid tables' cold halves) are stepped by FBGEMM's fused TBE optimizer, replicated rows
(data-parallel tables, hybrid hot halves) by rayemb's (:mod:`rayemb.train.worker.optim`), which keeps the same
state shapes. For a row of width D:

* ``rowwise_adagrad`` (FBGEMM ``EXACT_ROWWISE_ADAGRAD``; replicated: ``sum`` [rows, 1]): 1 value per row
* ``adagrad`` (``EXACT_ADAGRAD``; replicated: ``sum`` [rows, D]): D
* ``sgd`` (``EXACT_SGD``; replicated: ``torch.optim.SGD`` without momentum): none
* ``adam`` (``ADAM``: ``momentum1`` and ``momentum2`` both [rows, D]; replicated: ``exp_avg``, ``exp_avg_sq``): 2·D
* ``rowwise_adam`` (``PARTIAL_ROWWISE_ADAM``: ``momentum1`` [rows, D], ``momentum2`` [rows, 1]): D + 1

State is fp32 whatever the table's dtype (FBGEMM's default state dtype; rayemb's replicated optimizers cast it,
:func:`rayemb.train.worker.optim.fp32_state`). A column-wise shard is a table of its own to FBGEMM: each keeps
its own row-wise state, so a row split into k column shards holds k row-wise values. Per-table scalars (a step
count) are left out.

>>> optimizer_state_bytes("adam", 64), optimizer_state_bytes("rowwise_adagrad", 64)
(512, 4)
>>> optimizer_state_bytes("rowwise_adam", 64, shards=2)
264
"""

from __future__ import annotations

from typing import Dict, Tuple

from rayemb.errors import PlanError

#: bytes of one optimizer state value (fp32)
STATE_VALUE_BYTES = 4
#: the default ``train.embedding_optimizer``, and what a plan made without a job config counts
DEFAULT_EMBEDDING_OPTIMIZER = "rowwise_adagrad"
#: ``train.embedding_optimizer`` -> (state values per element, state values per row) (module docstring)
OPTIMIZER_STATE_VALUES: Dict[str, Tuple[int, int]] = {
    "rowwise_adagrad": (0, 1),
    "adagrad": (1, 0),
    "sgd": (0, 0),
    "adam": (2, 0),
    "rowwise_adam": (1, 1),
}


def check_embedding_optimizer_name(optimizer: str, where: str = "train.embedding_optimizer") -> None:
    """Raises ``PlanError`` (``invalid_input``) naming ``where`` when ``optimizer`` is not one the planner prices."""
    if optimizer not in OPTIMIZER_STATE_VALUES:
        raise PlanError(
            f"{where}: embedding optimizer {optimizer!r} is unknown, so its optimizer state cannot be sized; use "
            f"one of {tuple(OPTIMIZER_STATE_VALUES)} (train.embedding_optimizer).", category="invalid_input")


def optimizer_state_bytes(optimizer: str, dim: int, shards: int = 1) -> int:
    """Bytes of ``optimizer``'s state for one row of width ``dim``, split into ``shards`` column shards (each
    keeps its own row-wise state; 1 for every placement but column-wise)."""
    check_embedding_optimizer_name(optimizer)
    per_element, per_row = OPTIMIZER_STATE_VALUES[optimizer]
    return STATE_VALUE_BYTES * (per_element * int(dim) + per_row * int(shards))


__all__ = ["DEFAULT_EMBEDDING_OPTIMIZER", "OPTIMIZER_STATE_VALUES", "STATE_VALUE_BYTES",
           "check_embedding_optimizer_name", "optimizer_state_bytes"]
