"""A checkpoint's rows move in rounds of bounded size, and the files do not depend on the round size.

The model of ``test_logical_checkpoint`` (hybrid tables with row-, column- and
table-wise cold halves, plain table-, column-, row-wise and data-parallel
tables, two dims, row-wise Adagrad) trains a few steps on 2 gloo ranks and is
saved twice by the same ranks: in rounds of ~100 bytes (a row or two a round)
and in one round. The tensor files are equal byte for byte and the tensors in
``.metadata`` are described alike. Each is then loaded in ~100-byte rounds by 3
ranks of another plan and saved again: equal to the 2-rank checkpoint to 1e-6.
"""

from __future__ import annotations

import os

import pytest
import torch
from _sparse import checkpoint_step
from test_logical_checkpoint import PLAN_A, PLAN_B, TABLES, _build

from rayemb.checkpoint.export import unsharded_state
from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
#: ~100 bytes a round: 2 ranks get ~52 bytes each, one row of dim 8 with its header (48 bytes)
TINY_MIB = 100 / 2**20


def _rank(rank: int, world_size: int, plan_name: str, load: str, saves: dict, load_mib, train_steps: int):
    import torch.distributed as dist

    from rayemb.checkpoint.exchange import gather_canonical
    from rayemb.checkpoint.store import load_logical, save_logical

    dmp, opt, remapper = _build(world_size, PLAN_A if plan_name == "A" else PLAN_B, seed=rank + 7)
    if load:
        load_logical(load, dmp, opt, remapper, TABLES, chunk_mib=load_mib)
    for i in range(train_steps):
        checkpoint_step(dmp, opt, remapper, TABLES, LOCAL_BATCH, i, rank, world_size)
    for directory, mib in saves.items():
        torch.manual_seed(0)  # the RNG state meta.json records: the same for both saves
        save_logical(directory, dmp, opt, remapper, TABLES, {"epoch": 0, "step": train_steps}, chunk_mib=mib)
    # rounds: a tiny bound takes many, none takes one (every rank runs the same count)
    from rayemb.checkpoint import exchange
    from rayemb.checkpoint.layout import WEIGHT, model_slots

    counted = {}
    real = exchange._exchange_counts
    for label, chunk in (("tiny", int(TINY_MIB * 2**20)), ("one", None)):
        calls = []
        exchange._exchange_counts = lambda send, dev, calls=calls: calls.append(1) or real(send, dev)
        try:
            gather_canonical(model_slots(dmp.state_dict(), opt.state_dict()["state"], remapper), TABLES, WEIGHT,
                             chunk_bytes=chunk)
        finally:
            exchange._exchange_counts = real
        counted[label] = len(calls)
    dist.barrier()
    return counted


def _tensor_entries(directory: str) -> dict:
    from rayemb.checkpoint.safe_reader import SafeFileSystemReader

    md = SafeFileSystemReader(directory).metadata()
    return {k: (list(v.size), str(v.properties.dtype), [(list(c.offsets), list(c.sizes)) for c in v.chunks])
            for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks")}


def test_tiny_rounds_write_the_same_files_as_one_round_and_load_into_another_world(tmp_path):
    tiny, one = str(tmp_path / "tiny"), str(tmp_path / "one")
    rounds = run_multiprocess(_rank, 2, plan_name="A", load="", saves={tiny: TINY_MIB, one: None}, load_mib=None,
                              train_steps=3)
    assert rounds[0] == rounds[1], rounds
    assert rounds[0]["one"] == 1 and rounds[0]["tiny"] > 100, rounds  # ~200 sharded rows of weights a rank

    tensor_files = sorted(n for n in os.listdir(one) if n.endswith(".distcp"))
    assert tensor_files == ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(os.listdir(tiny)) == sorted(os.listdir(one))
    for name in tensor_files:
        with open(os.path.join(tiny, name), "rb") as a, open(os.path.join(one, name), "rb") as b:
            assert a.read() == b.read(), name
    assert _tensor_entries(tiny) == _tensor_entries(one)

    ref = unsharded_state(one)
    assert set(ref["tables"]) == set(TABLES)
    for source in (tiny, one):
        again = str(tmp_path / f"{os.path.basename(source)}_3")
        run_multiprocess(_rank, 3, plan_name="B", load=source, saves={again: TINY_MIB}, load_mib=TINY_MIB,
                         train_steps=0)
        got = unsharded_state(again)
        assert got["meta"]["world_size"] == 3
        for table in TABLES:
            for state, value in ref["tables"][table].items():
                torch.testing.assert_close(got["tables"][table][state], value, rtol=0, atol=1e-6,
                                           msg=f"{source}: {table}.{state}")
        for key, value in ref["dense"].items():
            torch.testing.assert_close(got["dense"][key], value, rtol=0, atol=1e-6)


def test_a_bound_that_is_not_positive_is_refused(one_rank_group):
    from rayemb.checkpoint.exchange import gather_canonical

    with pytest.raises(ValueError, match="chunk_bytes"):
        gather_canonical([], {"a": (4, 2)}, "weight", chunk_bytes=0)
