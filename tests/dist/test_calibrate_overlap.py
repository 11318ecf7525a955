"""The calibration's overlap probe on 2 gloo ranks: the all-reduce and the all-to-all alone and together, at the
job's sizes, read as a fraction in [0, 1] that the step-time model takes (rayemb.train.calibration.calibrate)."""

import statistics

from rayemb.multiprocess import run_multiprocess

SHAPE = dict(local_batch=256, num_sparse=8, dim=16)
DENSE_PARAM_BYTES = 40_000


def _rank(rank, world_size):
    import torch
    import torch.distributed as dist

    from rayemb.train.calibration.calibrate import add_overlap, overlap_sizes
    from rayemb.train.calibration.probes import Interleaved

    torch.set_num_threads(1)
    iv = Interleaved(barrier=dist.barrier)
    sizes = overlap_sizes(**SHAPE, dense_param_bytes=DENSE_PARAM_BYTES)
    read = add_overlap(iv, torch.device("cpu"), world_size, *sizes)
    iv.run(rounds=5, warmup=1)
    return {"fraction": read(), "sizes": sizes,
            "times": {k: list(v) for k, v in iv.times.items() if k.startswith("overlap/")}}


def test_overlap_fraction_measured_on_two_gloo_ranks():
    results = run_multiprocess(_rank, 2)
    for r in results:
        # DDP's all-reduce of the dense gradients, one pooled exchange of the local batch
        assert r["sizes"] == (DENSE_PARAM_BYTES, 4 * 256 * 8 * 16)
        times = r["times"]
        assert set(times) == {"overlap/all_reduce", "overlap/all_to_all", "overlap/together"}
        assert all(len(v) == 5 and min(v) > 0 for v in times.values())
        assert 0.0 <= r["fraction"] <= 1.0
        # the fraction is the median share of the shorter collective hidden, from the rounds' own times
        shares = [(ar + a2a - both) / min(ar, a2a) for ar, a2a, both in
                  zip(times["overlap/all_reduce"], times["overlap/all_to_all"], times["overlap/together"])]
        assert r["fraction"] == min(max(statistics.median(shares), 0.0), 1.0)
