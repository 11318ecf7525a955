"""Named synthetic workloads: presets over :class:`~rayemb.data.synthetic.SyntheticSpec`.

A profile fixes the shape of a dataset (tables, their row counts, each table's Zipf exponent) and a default
row count; ``rayemb gen-data --profile NAME`` writes it, with ``profile.json`` beside ``schema.yaml`` recording
what was drawn (the per-table exponents above all), so a benchmark can report the workload it ran on.

``criteo-1tb-scaled`` is the regime hybrid embedding exists for, on one machine: Criteo 1TB's 26 tables divided
by 16 (largest 3,058,592 rows; at dim 64 the tables hold 11.1M rows, 2.7 GiB of fp32 weights, too big to
replicate and all-reduce every step), each table's ids Zipf-distributed with its own exponent. A table's
size is ``max(ceil(V / scale), min(V, min_rows))`` for Criteo 1TB's ``V``: the big tables keep Criteo's
proportions, and a tiny table (3 to 62 values in Criteo) keeps its real size instead of collapsing to one row.
The exponents are ``n`` evenly spaced values over ``alpha_range`` dealt to the tables in an order drawn from
the seed, so every table has a different one and the same seed gives the same deal.
``criteo-1tb-tiny`` is its twin at test size: the same tables, floor and exponents, divided by 3000 (largest
16,313 rows).

Example::

    >>> profile = get_profile("criteo-1tb-scaled")
    >>> max(profile.cardinalities())
    3058592
    >>> generate_profile("criteo-1tb-scaled", "/tmp/c1tb", rows=20_000)  # parquet, schema.yaml, profile.json
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from rayemb.constants import CRITEO_1TB_CARDINALITIES
from rayemb.data.schema import DatasetSchema
from rayemb.data.synthetic import SyntheticSpec, generate
from rayemb.errors import DataError

#: the file beside schema.yaml that records a profile's draw
PROFILE_JSON = "profile.json"
#: third element of the seed sequence the exponents are dealt from (the data's own streams use 0 and 1 + chunk)
_ALPHA_STREAM = 7
#: decimals the exponents are rounded to, so profile.json holds exactly what the sampler used
_ALPHA_DECIMALS = 4


@dataclass(frozen=True)
class Profile:
    """One named workload: the tables' sizes and exponents, and the rows generated when none are asked for."""

    name: str
    description: str
    #: the real tables whose proportions the profile keeps
    base_cardinalities: Tuple[int, ...]
    #: each real table's rows are divided by this
    scale: int
    #: a table keeps at least ``min(real rows, min_rows)`` rows
    min_rows: int
    #: the per-table Zipf exponents are spread evenly over this closed range
    alpha_range: Tuple[float, float]
    #: total rows (train + valid) when ``rows`` is not given
    default_rows: int
    valid_fraction: float = 0.1

    def cardinalities(self) -> List[int]:
        """Rows of each table: ``max(ceil(V / scale), min(V, min_rows))``."""
        return [max(math.ceil(v / self.scale), min(v, self.min_rows)) for v in self.base_cardinalities]

    def zipf_alphas(self, seed: int) -> List[float]:
        """Each table's exponent: evenly spaced over ``alpha_range``, dealt to the tables in a seeded order."""
        n = len(self.base_cardinalities)
        lo, hi = self.alpha_range
        grid = np.linspace(lo, hi, n) if n > 1 else np.array([(lo + hi) / 2])
        order = np.random.default_rng(np.random.SeedSequence([seed, 0, _ALPHA_STREAM])).permutation(n)
        return [round(float(grid[i]), _ALPHA_DECIMALS) for i in order]

    def spec(self, rows: Optional[int] = None, seed: int = 0, **fields: Any) -> SyntheticSpec:
        """The profile's :class:`SyntheticSpec`; ``fields`` set the other ``SyntheticSpec`` fields (``multi_hot``,
        ``sequence_length``, ``second_label``, ``valid_fraction``, ``chunk_rows``, ...), not the ones the
        profile fixes."""
        fixed = sorted(set(fields) & {"num_tables", "zipf_alpha", "zipf_alphas", "scale", "cardinalities"})
        if fixed:
            raise DataError(f"Profile {self.name!r} fixes {fixed}; drop them, or generate without --profile to "
                            "choose the shape yourself.")
        fields.setdefault("valid_fraction", self.valid_fraction)
        return SyntheticSpec(
            rows=self.default_rows if rows is None else rows, seed=seed, num_tables=len(self.base_cardinalities),
            scale=self.scale, cardinalities=self.cardinalities(), zipf_alphas=self.zipf_alphas(seed), **fields,
        )

    def describe(self, spec: SyntheticSpec) -> Dict[str, Any]:
        """What ``profile.json`` holds: the profile, the request, and each table's rows and exponent."""
        n_valid = max(1, int(round(spec.rows * spec.valid_fraction)))
        return {
            "profile": self.name,
            "description": self.description,
            "seed": spec.seed,
            "rows": spec.rows,
            "train_rows": spec.rows - n_valid,
            "valid_rows": n_valid,
            "scale": self.scale,
            "min_rows": self.min_rows,
            "zipf_alpha_range": list(self.alpha_range),
            "spec": {k: v for k, v in asdict(spec).items() if k not in ("cardinalities", "zipf_alpha", "zipf_alphas")},
            "tables": [
                {"name": f"C{t + 1}", "rows": v, "base_rows": base, "zipf_alpha": alpha}
                for t, (v, base, alpha) in enumerate(
                    zip(spec.table_sizes(), self.base_cardinalities, spec.table_alphas()))
            ],
        }


#: 2,000+ steps at a global batch of 4096: 8.28M train rows and 0.92M valid rows
CRITEO_1TB_SCALED = Profile(
    name="criteo-1tb-scaled",
    description="Criteo 1TB's 26 tables divided by 16 (largest 3.06M rows), each with its own Zipf exponent in "
                "[0.8, 1.3]: tables too big to replicate, power-law id streams",
    base_cardinalities=tuple(CRITEO_1TB_CARDINALITIES),
    scale=16,
    min_rows=100,
    alpha_range=(0.8, 1.3),
    default_rows=9_200_000,
)

#: criteo-1tb-scaled's CI-size twin: the same 26 tables in the same proportions and the same exponents, small
#: enough (largest 16,313 rows, 60,608 in all: 15 MiB at dim 64) that a job's calibration and checkpoints cost
#: seconds, for tests that run the scaled workload's code paths end to end
CRITEO_1TB_TINY = Profile(
    name="criteo-1tb-tiny",
    description="criteo-1tb-scaled's CI-size twin: Criteo 1TB's 26 tables divided by 3000 (largest 16,313 rows), "
                "each with its own Zipf exponent in [0.8, 1.3]",
    base_cardinalities=CRITEO_1TB_SCALED.base_cardinalities,
    scale=3000,
    min_rows=CRITEO_1TB_SCALED.min_rows,
    alpha_range=CRITEO_1TB_SCALED.alpha_range,
    default_rows=20_000,
)

PROFILES: Dict[str, Profile] = {p.name: p for p in (CRITEO_1TB_SCALED, CRITEO_1TB_TINY)}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; a :class:`DataError` naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise DataError(f"Unknown data profile {name!r}; choose one of {sorted(PROFILES)}.") from None


def generate_profile(
    name: str,
    out_dir: str,
    rows: Optional[int] = None,
    seed: int = 0,
    progress: Optional[Callable[[int, int], None]] = None,
    **fields: Any,
) -> DatasetSchema:
    """Writes profile ``name`` to ``out_dir`` (:func:`rayemb.data.synthetic.generate`) and ``profile.json`` beside
    it. ``profile.json`` goes first and ``schema.yaml`` last, so a dataset that looks complete has both."""
    profile = get_profile(name)
    spec = profile.spec(rows, seed, **fields)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, PROFILE_JSON)
    with open(f"{path}.tmp", "w") as f:
        json.dump(profile.describe(spec), f, indent=2)
    os.replace(f"{path}.tmp", path)
    return generate(spec, out_dir, progress)


def load_profile_json(data_dir: str) -> Optional[Dict[str, Any]]:
    """``profile.json`` of a generated dataset, or None where the data came from no profile."""
    path = os.path.join(data_dir, PROFILE_JSON)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
