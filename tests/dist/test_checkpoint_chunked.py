"""A checkpoint's rows move in rounds of bounded size, and neither the rounds nor the staging change the files.

The model of ``test_logical_checkpoint`` (hybrid tables with row-, column- and
table-wise cold halves, plain table-, column-, row-wise and data-parallel
tables, two dims, row-wise Adagrad) trains a few steps on 2 gloo ranks and is
saved three times by the same ranks: staged in memory-mapped files in rounds of
~100 bytes (a row or two a round) and in one round, and with the canonical rows
in anonymous memory written by one ``dcp.save`` (what a save did before it
staged them). The tensor files are equal byte for byte, and so is ``.metadata``
but for the save's id and directory. Each is then loaded in ~100-byte rounds by
3 ranks of another plan (reading the stored pieces memory-mapped) and saved
again: equal to the 2-rank checkpoint to 1e-6.

A table of 64 MiB a rank is saved and loaded in rounds of 1 MiB: neither adds
more than a quarter of that share in anonymous memory (``RssAnon``) — holding
the share, or a stored piece of it, in memory would add all of it. A save, a
load and a save that fails in DCP's write leave no staging folder beside the
checkpoint and no staged file mapped.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from _sparse import checkpoint_step
from test_logical_checkpoint import PLAN_A, PLAN_B, TABLES, _build

from rayemb.checkpoint.export import unsharded_state
from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
#: ~100 bytes a round: 2 ranks get ~52 bytes each, less than a row of dim 8 counts (88 bytes): a row a round
TINY_MIB = 100 / 2**20
#: the table of the memory test: 2**19 rows of dim 64, row-wise sharded: 64 MiB of weights a rank
BIG_ROWS, BIG_DIM = 2**19, 64
STAGING_MARK = ".staging-"


def _in_memory(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def _save_in_memory(directory: str, dmp, opt, remapper) -> None:
    """A checkpoint's DCP files as a save wrote them before staging: canonical rows in anonymous memory, one round."""
    import torch.distributed.checkpoint as dcp

    from rayemb.checkpoint import store
    from rayemb.checkpoint.layout import MOMENTUM, WEIGHT, dense_entries, model_slots, stored_tables, table_dtypes

    model_state, optim_state = dmp.state_dict(), opt.state_dict()["state"]
    slots = model_slots(model_state, optim_state, remapper)
    state = store._canonical_state(slots, stored_tables(TABLES, model_state), [WEIGHT, MOMENTUM],
                                   table_dtypes(model_state), None, _in_memory)
    state.update({k: v.detach().cpu() for k, v in dense_entries(model_state, optim_state).items()})
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, sync_files=True))


def _rank(rank: int, world_size: int, plan_name: str, load: str, saves: dict, load_mib, train_steps: int,
          in_memory: str = ""):
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
    if in_memory:
        _save_in_memory(in_memory, dmp, opt, remapper)
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


def _metadata_bytes(directory: str, as_directory: str) -> bytes:
    """``.metadata`` of ``directory`` with its save id and directory name written as those of ``as_directory``."""
    from rayemb.checkpoint.safe_reader import DCP_METADATA, SafeFileSystemReader

    ids = [SafeFileSystemReader(d).metadata().storage_meta.save_id.encode() for d in (directory, as_directory)]
    # the directory is pickled as a PosixPath of its parts; a string of the same length keeps the layout
    names = [os.path.basename(d).encode() for d in (directory, as_directory)]
    assert len(names[0]) == len(names[1])
    with open(os.path.join(directory, DCP_METADATA), "rb") as f:
        data = f.read()
    assert data.count(ids[0]) == 1 and data.count(names[0]) == 1
    return data.replace(ids[0], ids[1]).replace(names[0], names[1])


def test_staged_saves_in_any_rounds_write_the_files_of_an_in_memory_save_and_load_into_another_world(tmp_path):
    from rayemb.checkpoint.safe_reader import DCP_METADATA

    tiny, one, heap = (str(tmp_path / name) for name in ("ck_tiny", "ck_full", "ck_heap"))
    rounds = run_multiprocess(_rank, 2, plan_name="A", load="", saves={tiny: TINY_MIB, one: None}, load_mib=None,
                              train_steps=3, in_memory=heap)
    assert rounds[0] == rounds[1], rounds
    assert rounds[0]["one"] == 1 and rounds[0]["tiny"] > 100, rounds  # ~200 sharded rows of weights a rank

    tensor_files = sorted(n for n in os.listdir(one) if n.endswith(".distcp"))
    assert tensor_files == ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(os.listdir(tiny)) == sorted(os.listdir(one))
    for staged in (tiny, one):
        for name in tensor_files:
            with open(os.path.join(staged, name), "rb") as a, open(os.path.join(heap, name), "rb") as b:
                assert a.read() == b.read(), f"{staged}/{name}"
        with open(os.path.join(heap, DCP_METADATA), "rb") as f:
            assert _metadata_bytes(staged, heap) == f.read(), staged
    assert _tensor_entries(tiny) == _tensor_entries(heap)
    assert not [n for n in os.listdir(tmp_path) if STAGING_MARK in n]

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


# ---- HOST MEMORY AND STAGING ---- #


def _anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def _peak_anon_extra(fn) -> int:
    """Bytes of anonymous memory ``fn()`` holds at its peak above what the process held before (sampled)."""
    base = _anon_bytes()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _anon_bytes())
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _anon_bytes()) - base


def _staged_mappings() -> list:
    with open("/proc/self/maps") as f:
        return [line.split(maxsplit=5)[-1].strip() for line in f if STAGING_MARK in line]


def _big_model(world_size: int, rows: int):
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders

    torch.manual_seed(0)
    ebc = HybridEmbeddingBagCollection([EmbeddingBagConfig(name="big", embedding_dim=BIG_DIM, num_embeddings=rows,
                                                           feature_names=["f_big"])], {}, device=torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    sharders = cpu_capable_sharders()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                    constraints=ebc.parameter_constraints({}, {"big": ["row_wise"]}, min_partition=4)
                                    ).collective_plan(ebc, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=sharders)
    return dmp, dmp.fused_optimizer, {"big": (rows, BIG_DIM)}


def _memory_rank(rank: int, world_size: int, root: str, rows: int) -> dict:
    import torch.distributed as dist

    from rayemb.checkpoint.store import load_logical, save_logical

    dmp, opt, tables = _big_model(world_size, rows)
    warm, measured = os.path.join(root, "warm"), os.path.join(root, "measured")
    save_logical(warm, dmp, opt, None, tables, {"epoch": 0, "step": 0}, chunk_mib=1)  # imports, first-use buffers
    dist.barrier()  # rank 0 writes meta.json last
    load_logical(warm, dmp, opt, None, tables, chunk_mib=1)
    dist.barrier()
    saved = _peak_anon_extra(lambda: save_logical(measured, dmp, opt, None, tables, {"epoch": 0, "step": 1},
                                                  chunk_mib=1))
    dist.barrier()
    loaded = _peak_anon_extra(lambda: load_logical(measured, dmp, opt, None, tables, chunk_mib=1))
    dist.barrier()
    return {"save": saved, "load": loaded, "mapped": _staged_mappings()}


def test_save_and_load_add_rounds_not_the_share_in_anonymous_memory(tmp_path):
    share = BIG_ROWS // 2 * BIG_DIM * 4  # the weights of a rank's canonical rows
    got = run_multiprocess(_memory_rank, 2, root=str(tmp_path), rows=BIG_ROWS)
    for rank, r in enumerate(got):
        assert r["save"] < share / 4, f"rank {rank}: a save added {r['save'] / 2**20:.1f} MiB of anonymous memory"
        assert r["load"] < share / 4, f"rank {rank}: a load added {r['load'] / 2**20:.1f} MiB of anonymous memory"
        assert r["mapped"] == [], r["mapped"]
    assert sorted(os.listdir(tmp_path)) == ["measured", "warm"]


def _leftover_rank(rank: int, world_size: int, root: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException

    from rayemb.checkpoint.store import load_logical, save_logical

    dmp, opt, remapper = _build(world_size, PLAN_A, seed=rank + 7)
    seen = {}
    good, bad = os.path.join(root, "good"), os.path.join(root, "bad")
    save_logical(good, dmp, opt, remapper, TABLES, {"epoch": 0, "step": 0}, chunk_mib=TINY_MIB)
    dist.barrier()  # both ranks' saves are over before either looks
    seen["after save"] = (sorted(os.listdir(root)), _staged_mappings())
    load_logical(good, dmp, opt, remapper, TABLES, chunk_mib=TINY_MIB)
    dist.barrier()
    seen["after load"] = (sorted(os.listdir(root)), _staged_mappings())
    dist.barrier()
    if rank == 1:  # rank 1's tensor file cannot be created: DCP's write fails there, once the rows are staged
        os.makedirs(os.path.join(bad, "__1_0.distcp"))
    dist.barrier()
    try:
        save_logical(bad, dmp, opt, remapper, TABLES, {"epoch": 0, "step": 0}, chunk_mib=TINY_MIB)
        seen["failed"] = None
    except CheckpointException as e:  # on every rank, with each failed rank's error
        seen["failed"] = str(e)
    dist.barrier()
    seen["after failed save"] = (sorted(os.listdir(root)), _staged_mappings())
    return seen


def test_a_save_a_load_and_a_failed_save_leave_no_staging_behind(tmp_path):
    got = run_multiprocess(_leftover_rank, 2, root=str(tmp_path))
    for rank, seen in enumerate(got):
        assert seen["failed"] is not None and "IsADirectoryError" in seen["failed"], seen["failed"]
        assert seen["after save"][0] == ["good"] and seen["after load"][0] == ["good"], seen
        assert seen["after failed save"][0] == ["bad", "good"], seen
        for moment in ("after save", "after load", "after failed save"):
            assert seen[moment][1] == [], f"rank {rank} {moment}: staged files still mapped {seen[moment][1]}"


def test_a_bound_that_is_not_positive_is_refused(one_rank_group):
    from rayemb.checkpoint.exchange import gather_canonical

    with pytest.raises(ValueError, match="chunk_bytes"):
        gather_canonical([], {"a": (4, 2)}, "weight", chunk_bytes=0)
