"""A small dataset with raw-id features, for the tests of jobs that train raw-id tables.

Columns: ``label``; dense ``I1``, ``I2``; encoded ``C1`` (one-hot, 200 ids with
Zipf frequencies: enough rows for a hybrid split) and ``C2`` (multi-hot, 15 ids); raw ``U1``, int64 ids drawn once as random 64-bit values (negative
ones and ones above 2**62 among them) and sampled with Zipf frequencies; raw
``S1``, string ids (``"user_<k>"``, some non-ASCII). The label's logit is a
hidden score of ``U1``'s id plus ``S1``'s and ``C1``'s, so a model that learns
the raw tables' rows scores better than chance. The validation split also
holds ids the training split never has (an unseen id reads the zero row).
"""

from __future__ import annotations

from typing import Dict

import numpy as np

#: distinct ids of each raw feature (a few more appear in the validation split only)
U1_IDS, S1_IDS = 300, 40
#: rows of the encoded one-hot table C1
C1_ROWS = 200


def raw_vocabularies(seed: int = 0) -> Dict[str, np.ndarray]:
    """The raw ids of ``U1`` (int64) and ``S1`` (strings), most frequent first; index ``k`` is drawn with
    probability ~ 1 / (k + 1)**1.1."""
    rng = np.random.default_rng(seed)
    u1 = np.unique(np.concatenate([rng.integers(-(2 ** 63), 2 ** 63 - 1, size=U1_IDS + 20, dtype=np.int64),
                                   rng.integers(2 ** 62, 2 ** 63 - 1, size=10, dtype=np.int64)]))
    u1 = rng.permutation(u1)[:U1_IDS + 20]
    s1 = np.array([f"user_{k}" if k % 7 else f"usér_{k}_ü" for k in range(S1_IDS + 5)], dtype=object)
    return {"U1": u1, "S1": s1}


def raw_id_dataset(path: str, rows: int = 3000, u1_capacity: int = 1024, s1_capacity: int = 128,
                   seed: int = 0) -> str:
    """Writes the dataset to ``path`` (``schema.yaml``, ``train/`` and ``valid/``, a fifth of the rows) and returns
    it; ``u1_capacity`` / ``s1_capacity`` are the raw tables' ``num_embeddings`` (below the distinct ids: they
    evict)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayemb.data.schema import DatasetSchema, SparseFeature

    vocab = raw_vocabularies(seed)
    rng = np.random.default_rng(seed + 1)
    hidden = {name: rng.normal(0, 1.5, size=len(v)) for name, v in vocab.items()}
    c1_score = rng.normal(0, 1.0, size=C1_ROWS)
    n_valid = rows // 5

    def zipf(n: int, ids: int) -> np.ndarray:
        p = 1.0 / np.arange(1, ids + 1) ** 1.1
        return rng.choice(ids, size=n, p=p / p.sum())

    def draw(name: str, n: int, seen: int, valid: bool) -> np.ndarray:
        picks = zipf(n, seen)
        if valid:  # a few ids training never sees
            fresh = rng.random(n) < 0.05
            picks[fresh] = rng.integers(seen, len(vocab[name]), size=int(fresh.sum()))
        return picks

    for split, n in (("train", rows - n_valid), ("valid", n_valid)):
        u = draw("U1", n, U1_IDS, split == "valid")
        s = draw("S1", n, S1_IDS, split == "valid")
        c1 = zipf(n, C1_ROWS)
        lengths = rng.integers(0, 4, size=n)
        c2 = pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                                      pa.array(rng.integers(0, 15, size=int(lengths.sum())), pa.int64()))
        logit = 1.2 * hidden["U1"][u] + 1.0 * hidden["S1"][s] + c1_score[c1] - 0.5
        label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        table = pa.table({"label": label, "I1": rng.exponential(3.0, n).astype(np.float32),
                          "I2": rng.exponential(1.0, n).astype(np.float32), "C1": pa.array(c1, pa.int64()),
                          "C2": c2, "U1": pa.array(vocab["U1"][u], pa.int64()),
                          "S1": pa.array(vocab["S1"][s].tolist(), pa.string())})
        os.makedirs(os.path.join(path, split), exist_ok=True)
        pq.write_table(table, os.path.join(path, split, "part-00000.parquet"))
    DatasetSchema(label="label", dense=("I1", "I2"), sparse=(
        SparseFeature("C1", C1_ROWS), SparseFeature("C2", 15, multi_hot=True),
        SparseFeature("U1", u1_capacity, ids="raw", eviction="lfu"),
        SparseFeature("S1", s1_capacity, ids="raw", eviction="lru"))).save(path)
    return path
