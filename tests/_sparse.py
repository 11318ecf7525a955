"""Pieces the distributed equivalence tests share: a KJT slice of generated bags, and a tiny model head.

``feats`` maps a feature name to ``(lengths, values, weights or None)`` numpy arrays over the
whole global batch; :func:`kjt_slice` cuts rows ``[lo, hi)`` of every feature into one
``KeyedJaggedTensor`` (key-major, as TorchRec expects), so each rank takes its own rows and the
reference takes them all. :class:`HeadModel` puts a linear head on any module that maps a KJT to
a ``KeyedTensor`` (an EBC, rayemb's hybrid or compressed embeddings).
"""

from __future__ import annotations

import numpy as np
import torch


def kjt_slice(feats, lo: int, hi: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys, vals, lens, ws = [], [], [], []
    for k, (lengths, values, w) in feats.items():
        offs = np.concatenate([[0], np.cumsum(lengths)])
        keys.append(k)
        lens.append(lengths[lo:hi])
        vals.append(values[offs[lo]:offs[hi]])
        if w is not None:
            ws.append(w[offs[lo]:offs[hi]])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.from_numpy(np.concatenate(vals)), lengths=torch.from_numpy(np.concatenate(lens)),
        weights=torch.from_numpy(np.concatenate(ws)) if ws else None,
    )


class HeadModel(torch.nn.Module):
    """``sparse`` (KJT -> KeyedTensor) followed by ``Linear(in_dim, 1)``: a logit per row."""

    def __init__(self, sparse: torch.nn.Module, in_dim: int) -> None:
        super().__init__()
        self.sparse = sparse
        self.head = torch.nn.Linear(in_dim, 1)

    def forward(self, kjt) -> torch.Tensor:
        return self.head(self.sparse(kjt).values()).squeeze(1)


def rowwise_adagrad_(p: torch.Tensor, state: dict, key, lr: float, eps: float, col_blocks=(), rows=None) -> None:
    """Reference row-wise Adagrad step of one table (FBGEMM EXACT_ROWWISE_ADAGRAD), in place:
    ``G_r += mean_j g_rj²;  w_r -= lr · g_r / (sqrt(G_r) + eps)``; ``state[key]`` holds ``G`` (broadcast to
    ``p``'s shape). A column-wise sharded table keeps one ``G_r`` per column shard: ``col_blocks`` =
    ``[(c0, width), ...]`` run the mean over each shard's columns, for the rows in mask ``rows`` (all rows
    when None). No gradient: nothing to do."""
    if p.grad is None:
        return
    with torch.no_grad():
        g = p.grad
        s = state.setdefault(key, torch.zeros_like(p))
        inc = g.pow(2).mean(dim=1, keepdim=True).expand_as(g).clone()
        sel = slice(None) if rows is None else rows
        for c0, c in col_blocks:
            inc[sel, c0:c0 + c] = g[sel, c0:c0 + c].pow(2).mean(dim=1, keepdim=True)
        s += inc
        p -= lr * g / (s.sqrt() + eps)


def checkpoint_batch(remapper, tables: dict, local_batch: int, step: int, rank: int, world_size: int):
    """(remapped KJT, labels) of this rank's slice of global batch ``step`` (the same rows whatever the world size).

    ``tables``: name -> (rows, dim); feature ``f_<name>`` gets 1-3 ids per bag. The global batch is
    ``6 * local_batch`` (divisible by 2 and 3).
    """
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rng = np.random.default_rng(1000 + step)
    global_batch = local_batch * 6
    keys, lengths, values = [], [], []
    lo, hi = rank * global_batch // world_size, (rank + 1) * global_batch // world_size
    for n, (v, _) in tables.items():
        lens = rng.integers(1, 4, size=global_batch)
        ids = rng.integers(0, v, size=int(lens.sum()))
        offs = np.concatenate([[0], np.cumsum(lens)])
        keys.append(f"f_{n}")
        lengths.append(lens[lo:hi])
        values.append(ids[offs[lo]:offs[hi]])
    labels = torch.from_numpy(rng.integers(0, 2, size=global_batch).astype(np.float32))[lo:hi]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(np.concatenate(values)),
                                              lengths=torch.from_numpy(np.concatenate(lengths)))
    return remapper.remap(kjt), labels


def checkpoint_step(dmp, opt, remapper, tables: dict, local_batch: int, step: int, rank: int, world_size: int) -> float:
    """One step of the checkpoint tests on :func:`checkpoint_batch` ``step``; returns the mean loss over ranks."""
    kjt, labels = checkpoint_batch(remapper, tables, local_batch, step, rank, world_size)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(kjt), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    t = loss.detach().clone()
    torch.distributed.all_reduce(t)
    return float(t) / world_size


def assert_same_state(x: dict, y: dict, where: str = "") -> None:
    """Nested dicts of tensors equal bit for bit (same keys, dtypes and values)."""
    assert sorted(x) == sorted(y), (where, sorted(x), sorted(y))
    for k in x:
        if isinstance(x[k], dict):
            assert_same_state(x[k], y[k], f"{where}.{k}")
        elif isinstance(x[k], torch.Tensor):
            assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), f"{where}.{k} differs"


def reference_rows(ref_sd: dict, remapper, table: str):
    """(logical table, the unsharded reference's rows) that a sharded table ``table`` holds: a hybrid table's hot
    or cold half (``<T>__hot`` / ``<T>__cold``, rows in the remapper's order), or every row of a plain table."""
    logical = table.removesuffix("__hot").removesuffix("__cold")
    full = ref_sd[f"sparse.embedding_bags.{logical}.weight"]
    if table.endswith("__hot"):
        return logical, full[torch.from_numpy(remapper.hot_ids(logical))]
    if table.endswith("__cold"):
        return logical, full[torch.from_numpy(remapper.cold_ids(logical))]
    return logical, full


def local_tensors(value) -> list:
    """The tensors this rank holds of a state-dict entry, as numpy (shards of a sharded tensor)."""
    if hasattr(value, "local_shards"):
        return [s.tensor.detach().numpy().copy() for s in value.local_shards()]
    if isinstance(value, torch.Tensor):
        return [value.detach().numpy().copy()]
    return []
