"""Synthetic MovieLens ratings (``ratings.csv``: ``userId,movieId,rating,timestamp``) with a known structure.

A rating is ``mu + b_user + b_item + <p_user, q_item> + noise``, rounded to
half stars and clipped to 0.5..5 as MovieLens' are: per-user and per-item biases,
a low-rank user x item affinity, and Gaussian noise. Which items a user rates
follows a long-tailed popularity (item ``i`` of a shuffled catalogue drawn with
weight ``(rank + 1) ** -popularity_exponent``), and a user's count of ratings is
log-normal, at least ``min_per_user``: a few heavy raters, many light ones. A
model that learns the biases and the affinity beats the mean predictor; one that
sees a binarised label or fits it as a binary task cannot be scored against it.

Example::

    >>> write_ratings_csv("ratings.csv", users=300, items=200, seed=0)
    11588
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RatingsSpec:
    """The generating model's sizes and scales (ratings' units: stars)."""

    users: int = 1000
    items: int = 500
    rank: int = 8
    mean: float = 3.5
    user_bias_std: float = 0.4
    item_bias_std: float = 0.5
    #: std of the affinity term ``<p_user, q_item>``
    affinity_std: float = 0.8
    noise_std: float = 0.6
    mean_per_user: float = 40.0
    min_per_user: int = 5
    popularity_exponent: float = 1.0


def ratings(spec: RatingsSpec, seed: int = 0) -> np.ndarray:
    """``(N, 4)`` float64 rows ``(userId, movieId, rating, timestamp)``, ids from 1, grouped by user."""
    rng = np.random.default_rng(seed)
    user_bias = rng.normal(0.0, spec.user_bias_std, spec.users)
    item_bias = rng.normal(0.0, spec.item_bias_std, spec.items)
    scale = np.sqrt(spec.affinity_std / np.sqrt(spec.rank))  # each factor's std: the dot product's is affinity_std
    p = rng.normal(0.0, scale, (spec.users, spec.rank))
    q = rng.normal(0.0, scale, (spec.items, spec.rank))
    popularity = (np.arange(spec.items) + 1.0) ** -spec.popularity_exponent
    popularity = popularity[rng.permutation(spec.items)]
    popularity /= popularity.sum()
    sigma = 0.8
    counts = rng.lognormal(np.log(spec.mean_per_user) - sigma ** 2 / 2, sigma, spec.users)
    counts = np.clip(counts.astype(np.int64), spec.min_per_user, spec.items)
    rows = []
    for u in range(spec.users):
        items = rng.choice(spec.items, size=counts[u], replace=False, p=popularity)
        raw = (spec.mean + user_bias[u] + item_bias[items] + q[items] @ p[u]
               + rng.normal(0.0, spec.noise_std, len(items)))
        stars = np.clip(np.round(raw * 2.0) / 2.0, 0.5, 5.0)
        start = 1_000_000_000 + int(rng.integers(0, 10**7))
        times = start + np.sort(rng.integers(0, 10**6, len(items)))
        rows.append(np.stack([np.full(len(items), u + 1.0), items + 1.0, stars, times.astype(np.float64)], axis=1))
    return np.concatenate(rows)


def write_ratings_csv(path: str, users: int = 1000, items: int = 500, seed: int = 0, **spec: float) -> int:
    """Writes :func:`ratings` of ``RatingsSpec(users, items, **spec)`` as a MovieLens ``ratings.csv``; returns
    its row count."""
    rows = ratings(RatingsSpec(users=users, items=items, **spec), seed)  # type: ignore[arg-type]
    with open(path, "w") as f:
        f.write("userId,movieId,rating,timestamp\n")
        for u, m, r, t in rows:
            f.write(f"{int(u)},{int(m)},{r:.1f},{int(t)}\n")
    return len(rows)


__all__ = ["RatingsSpec", "ratings", "write_ratings_csv"]
