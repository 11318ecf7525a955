"""Raw ids at inference: each raw id's row in the exported model's plain table, or the zero row.

The inference model keeps every table as a plain ``EmbeddingBagCollection``
table of ``num_embeddings`` rows, raw-id tables included (their capacity).
A trained raw-id table is the set of ids it held, with their rows
(:mod:`rayemb.checkpoint.raw_state`); :func:`raw_table_rows` lays them out
as rows ``0..n-1``, ascending by raw id, every other row zero. Row
``num_embeddings - 1`` is always among the zero ones (a table of N rows on W
ranks holds at most N - W ids), and :class:`RawIdRows` maps every other id
there: an id unseen in training (or evicted) pools as the zero vector, as it
did in the sharded model, and nothing is inserted.

The mapping runs in the data path, as the hybrid remap does in training: the
batch converter turns string ids into int64 (the training hash) and then
``RawIdRows.remap`` turns raw ids into rows, so the model itself, of any
factory, sees plain tables. The sorted ids travel in ``model.pt`` beside the
model's state, under ``raw_ids.<table>`` (:meth:`RawIdRows.state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

import numpy as np

from rayemb.errors import DataError

if TYPE_CHECKING:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

#: prefix of the sorted raw ids of a table in an export's ``model.pt``
STATE_PREFIX = "raw_ids."


class RawIdRows:
    """Raw id -> row of every raw-id table (picklable numpy; module docstring).

    ``ids``: table -> the raw ids it held, ascending (row ``j`` holds ``ids[j]``);
    ``rows``: table -> its ``num_embeddings`` (the last row is the zero default).
    """

    def __init__(self, ids: Mapping[str, np.ndarray], rows: Mapping[str, int]) -> None:
        self.ids = {t: np.asarray(v, dtype=np.int64) for t, v in ids.items()}
        self.num_rows = {t: int(rows[t]) for t in self.ids}
        for t, v in self.ids.items():
            if len(v) >= self.num_rows[t] or (len(v) > 1 and not bool((np.diff(v) > 0).all())):
                raise DataError(f"Raw-id table {t!r} of the model holds {len(v)} ids for {self.num_rows[t]} rows, or "
                                "ids out of order; the export is damaged. Export the checkpoint again.",
                                category="bad_checkpoint")

    def rows(self, table: str, values: np.ndarray) -> np.ndarray:
        """The row of each raw id of ``table``: its position among the held ids, else the last (zero) row."""
        ids = self.ids[table]
        values = np.asarray(values, dtype=np.int64)
        if not ids.size:
            return np.full(values.shape, self.num_rows[table] - 1, dtype=np.int64)
        pos = np.searchsorted(ids, values)
        held = ids[np.minimum(pos, ids.size - 1)] == values
        return np.where(held, pos, self.num_rows[table] - 1).astype(np.int64)

    def remap(self, kjt: "KeyedJaggedTensor") -> "KeyedJaggedTensor":
        """``kjt`` (keys: the schema's pooled features) with the raw features' ids replaced by their rows."""
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        values = kjt.values().numpy().copy()
        ends = np.cumsum(kjt.length_per_key())
        for key, end, n in zip(kjt.keys(), ends, kjt.length_per_key()):
            if key in self.ids:
                values[end - n:end] = self.rows(key, values[end - n:end])
        return KeyedJaggedTensor.from_lengths_sync(keys=kjt.keys(), values=torch.from_numpy(values),
                                                   lengths=kjt.lengths(), weights=kjt.weights_or_none())

    def state(self) -> Dict[str, "torch.Tensor"]:
        """The sorted ids as ``model.pt`` entries (``raw_ids.<table>``)."""
        import torch

        return {STATE_PREFIX + t: torch.from_numpy(v.copy()) for t, v in self.ids.items()}

    @classmethod
    def split_state(cls, state: Mapping[str, Any], schema: Any) -> Tuple[Optional["RawIdRows"], Dict[str, Any]]:
        """(the raw-id rows of an export's ``state``, or None without raw-id tables; the model's own state).

        :class:`DataError` when the schema's raw-id tables and the state's ``raw_ids.*`` entries differ."""
        ids = {k[len(STATE_PREFIX):]: v for k, v in state.items() if k.startswith(STATE_PREFIX)}
        rest = {k: v for k, v in state.items() if not k.startswith(STATE_PREFIX)}
        if sorted(ids) != sorted(schema.raw_names):
            raise DataError(f"The model's state holds raw ids for tables {sorted(ids)}, its schema declares raw-id "
                            f"tables {sorted(schema.raw_names)}. Export the checkpoint again with its schema.",
                            category="bad_checkpoint")
        if not ids:
            return None, rest
        rows = {f.name: int(f.num_embeddings) for f in schema.sparse}
        return cls({t: v.cpu().numpy() for t, v in ids.items()}, rows), rest


def raw_table_rows(entries: Mapping[str, Any], num_rows: int, dim: int) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """(the plain table ``[num_rows, dim]`` of a trained raw-id table, its sorted ids) from the checkpoint's entries
    (``ids`` ascending, ``weight``: :func:`rayemb.checkpoint.export.unsharded_state`'s ``raw_tables``)."""
    import torch

    ids, weight = entries["ids"].to(torch.int64), entries["weight"].to(torch.float32)
    if ids.numel() >= num_rows or tuple(weight.shape) != (ids.numel(), dim):
        raise DataError(f"A raw-id table of the checkpoint holds {ids.numel()} ids with rows {tuple(weight.shape)}; "
                        f"this schema and model config make it {num_rows} rows x {dim}, the last one zero. Export "
                        "with the config and dataset the checkpoint was trained with.", category="bad_checkpoint")
    table = torch.zeros(num_rows, dim, dtype=torch.float32)
    table[:ids.numel()] = weight
    return table, ids


__all__ = ["RawIdRows", "STATE_PREFIX", "raw_table_rows"]
