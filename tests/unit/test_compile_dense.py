"""train.compile: dense: torch.compile of the model's dense part, the embedding modules left eager, each compiled
module falling back to eager on its own.

The job's DLRM is sharded by the loop's own ``sharded_model`` on a one-rank gloo group, with a plan that has a
hybrid table (its hot rows are dense parameters inside the embedding module), row-, column-, table-wise and
data-parallel tables. The checks compile with a counting ``aot_eager`` backend (Dynamo and AOTAutograd as
inductor runs them, without generating kernels), so that a test also fails when nothing was compiled at all.
Inductor's own kernels are left to ``jobs/bench/gpu.py --compile``: on a CPU its first compile in a process
probes the machine with the C++ compiler and builds C++ kernels, too slow for this file, and the GPU's kernels
and CUDA graphs are what it is for.
"""

from __future__ import annotations

import logging
from typing import Any, List

import numpy as np
import pytest
import torch
from torch import nn

from rayemb.data.schema import DatasetSchema, SparseFeature

DIM = 8
BATCH = 32
STEPS = 3
#: table -> (placement, sharding type of the table / of a hybrid table's cold half, hot ids)
PLAN = {
    "C1": ("hybrid", "row_wise", np.arange(0, 24, 2)),
    "C2": ("row_wise", "row_wise", None),
    "C3": ("column_wise", "column_wise", None),
    "C4": ("table_wise", "table_wise", None),
    "C5": ("data_parallel", "data_parallel", None),
    "C6": ("table_wise", "table_wise", None),
}
LOGGER = "rayemb.train.worker.compile"


class CountingBackend:
    """``aot_eager`` that counts the forward and backward graphs it compiles; ``fail_on``: an aten op whose
    presence in a graph of kind ``fail_in`` ("fw" or "bw") makes that compile raise."""

    def __init__(self, fail_on: Any = None, fail_in: str = "bw") -> None:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        self.graphs: List[str] = []

        def compiler(kind: str) -> Any:
            def compile_graph(gm: Any, example_inputs: Any) -> Any:
                if fail_on is not None and kind == fail_in and any(n.target == fail_on for n in gm.graph.nodes):
                    raise RuntimeError(f"no kernel for {fail_on} in this {kind} graph")
                self.graphs.append(kind)
                return make_boxed_func(gm.forward)
            return compile_graph

        self.backend = aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw"))


# ---- the job's DLRM, sharded as the loop shards it ---- #


@pytest.fixture(scope="module")
def job(tmp_path_factory, one_rank_group):
    from rayemb.config import config_from_dict
    from tests._export import fixed_job_plan, small_dataset

    data = small_dataset(str(tmp_path_factory.mktemp("compile") / "data"), rows=400)
    schema = DatasetSchema.load(data)
    cfg = config_from_dict({"name": "compile", "data": {"path": data, "batch_size": BATCH},
                            "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]},
                            "train": {"dense_lr": 0.1, "embedding_lr": 0.1, "compile": "dense"}})
    return cfg, schema, fixed_job_plan(cfg, schema, PLAN, DIM, world_size=1)


def _sharded(job):
    from rayemb.train.worker.build import sharded_model

    cfg, schema, job_plan = job
    torch.manual_seed(cfg.train.seed)
    return sharded_model(cfg, schema, job_plan, torch.device("cpu"))


def _batches(job, remapper) -> List[Any]:
    import pyarrow.parquet as pq

    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.train.worker.loop import _step_batch

    cfg, schema, _ = job
    train = pq.read_table(parquet_files(cfg.data.path, "train"))
    convert = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap)
    return [_step_batch(convert(train.slice(i * BATCH, BATCH)), torch.device("cpu")) for i in range(STEPS)]


def _dense_state(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "dense_arch" in n or "over_arch" in n}


def test_the_sharded_dlrm_compiles_its_mlps_and_none_of_its_embedding_modules(job):
    from rayemb.embedding.data_parallel import replicated_embedding_parameters
    from rayemb.train.worker.compile import compile_dense, compiled_names, dense_subtrees

    model, _, _ = _sharded(job)
    found = dense_subtrees(model)
    assert [n for n, _ in found] == ["dense_arch", "over_arch"]  # names inside DMP and its DDP wrapper
    compiled_params = {id(p) for _, m in found for p in m.parameters()}
    for name, p in model.named_parameters():
        # the tables, the hybrid table's hot rows and the data-parallel table are all outside what is compiled
        assert (id(p) in compiled_params) == ("dense_arch" in name or "over_arch" in name), name
    # the dense parameters that are embedding rows (the hot half, the data-parallel table) were there to exclude
    assert sorted(replicated_embedding_parameters(model)) == ["embedding.hot.embedding_bags.C1__hot.weight",
                                                            "embedding.plain.embedding_bags.C5.weight"]
    backend = CountingBackend()
    assert compile_dense(model, backend=backend.backend) == ["dense_arch", "over_arch"]
    assert compiled_names(model) == ["dense_arch", "over_arch"]
    assert all(m._compiled_call_impl is None for n, m in model.named_modules() if ".embedding" in n)


def test_three_compiled_steps_give_the_eager_losses_and_dense_weights(job):
    from rayemb.train.worker.compile import compile_dense
    from rayemb.train.worker.losses import job_loss
    from rayemb.train.worker.step import TrainStep

    cfg, schema, _ = job
    runs = {}
    for compiled in (False, True):
        model, optimizer, remapper = _sharded(job)
        before = _dense_state(model)
        backend = CountingBackend()
        if compiled:
            compile_dense(model, backend=backend.backend)
        step = TrainStep(model, optimizer, job_loss(schema, cfg.train.task_weights))
        batches = _batches(job, remapper)
        loss = step.forward(batches[0])
        # both modules compiled, each backward with its forward (not at the first backward)
        assert backend.graphs == (["fw", "bw", "fw", "bw"] if compiled else []), backend.graphs
        step.backward(loss)
        losses = [float(loss)] + [float(step(b)) for b in batches[1:]]
        assert backend.graphs == (["fw", "bw", "fw", "bw"] if compiled else [])  # no recompiles
        runs[compiled] = (before, losses, _dense_state(model))
    (before_e, losses_e, after_e), (before_c, losses_c, after_c) = runs[False], runs[True]
    assert all(torch.equal(before_e[n], before_c[n]) for n in before_e)  # the same start
    np.testing.assert_allclose(losses_c, losses_e, rtol=0, atol=1e-5)
    assert set(after_c) == set(after_e) and len(after_e) == 8
    for n in after_e:
        assert not torch.equal(after_e[n], before_e[n]), f"{n} did not train"
        torch.testing.assert_close(after_c[n], after_e[n], rtol=0, atol=1e-5, msg=n)


# ---- a model of one's own ---- #

SCHEMA = DatasetSchema(label="label", dense=("a", "b"), sparse=(SparseFeature("s1", 20), SparseFeature("s2", 30)))


class Features(nn.Module):
    """Holds the embedding module and a dense projection of the dense features: not compiled as a whole."""

    def __init__(self, embedding: nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.project = nn.Linear(2, DIM)

    def forward(self, dense, sparse):
        return torch.cat([self.project(dense), self.embedding(sparse).values()], dim=1)


class Tower(nn.Module):
    def __init__(self, embeddings, schema) -> None:
        super().__init__()
        self.features = Features(embeddings.pooled)
        self.act = nn.ReLU()  # no parameters: nothing to compile
        self.tower = nn.Sequential(nn.Linear(3 * DIM, 16), nn.Tanh(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, dense, sparse):
        return self.head(self.act(self.tower(self.features(dense, sparse)))).squeeze(-1)


def _tower_model(cls=Tower):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.contract.model import Embeddings
    from rayemb.contract.factory import ModelSpec
    from rayemb.contract.tables import table_configs

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=table_configs(SCHEMA, DIM), device=torch.device("cpu"))
    model, _ = ModelSpec(cls, {}, "test:tower").build(Embeddings(ebc, tuple(SCHEMA.sparse_names), DIM), SCHEMA)
    return model


def _tower_batches(n: int = STEPS):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.train.worker.step import StepBatch

    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.cat([torch.randint(0, 20, (BATCH,), generator=g), torch.randint(0, 30, (BATCH,), generator=g)])
        kjt = KeyedJaggedTensor.from_lengths_sync(["s1", "s2"], ids, torch.ones(2 * BATCH, dtype=torch.int32))
        out.append(StepBatch((torch.rand(BATCH, 2, generator=g), kjt), (ids[:BATCH] % 2).float(), kjt))
    return out


def _train_tower(model, batches):
    from rayemb.train.worker.losses import TaskLoss
    from rayemb.train.worker.step import TrainStep

    step = TrainStep(model, torch.optim.Adagrad(model.parameters(), lr=0.1), TaskLoss(["label"]))
    return [float(step(b)) for b in batches]


def _assert_same_training(model, eager, losses, eager_losses):
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-5, msg=n)


def test_a_model_of_ones_own_compiles_its_dense_children_and_not_its_embeddings():
    from rayemb.train.worker.compile import compile_dense, dense_subtrees

    model = _tower_model()
    # Features holds the embedding module: only its projection; the parameter-free ReLU: not at all
    assert [n for n, _ in dense_subtrees(model)] == ["features.project", "tower", "head"]
    backend = CountingBackend()
    assert compile_dense(model, backend=backend.backend) == ["features.project", "tower", "head"]
    eager = _tower_model()
    batches = _tower_batches()
    losses = _train_tower(model, batches)
    # three compiled modules, each a forward and a backward graph; torch.nn's own (the Sequential) included
    assert sorted(backend.graphs) == ["bw"] * 3 + ["fw"] * 3, backend.graphs
    _assert_same_training(model, eager, losses, _train_tower(eager, batches))
    assert losses[-1] != losses[0]


@pytest.mark.parametrize("fail_in", ["fw", "bw"])
def test_a_module_whose_compile_fails_runs_eagerly_with_one_warning_and_trains(caplog, fail_in):
    from rayemb.train.worker.compile import compile_dense, compiled_names

    model = _tower_model()
    # the tower's graphs hold tanh: its forward (or backward) cannot compile; the other modules can
    backend = CountingBackend(fail_on=torch.ops.aten.tanh.default if fail_in == "fw" else
                              torch.ops.aten.tanh_backward.default, fail_in=fail_in)
    compile_dense(model, backend=backend.backend)
    eager = _tower_model()
    batches = _tower_batches(STEPS)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        losses = _train_tower(model, batches)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert "the compiled tower failed" in warnings[0] and "no kernel for aten.tanh" in warnings[0]
    assert "runs eagerly from now on" in warnings[0]
    assert compiled_names(model) == ["features.project", "head"]  # the others stay compiled
    # the others' forward and backward; where the tower's backward failed, its forward had compiled first
    assert sorted(backend.graphs) == ["bw", "bw"] + ["fw"] * (2 if fail_in == "fw" else 3), backend.graphs
    _assert_same_training(model, eager, losses, _train_tower(eager, batches))


def test_without_torch_compile_the_model_stays_eager_with_a_warning(monkeypatch, caplog):
    from rayemb.train.worker.compile import compile_dense, compiled_names

    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unavailable)
    model = _tower_model()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert compile_dense(model) == []
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "torch.compile is unavailable" in warnings[0] and "this Python" in warnings[0]
    assert compiled_names(model) == [] and all(m._compiled_call_impl is None for m in model.modules())
    assert len(_train_tower(model, _tower_batches(1))) == 1


def test_the_job_setting_compiles_only_when_asked_and_logs_what(caplog):
    from rayemb.config import config_from_dict
    from rayemb.train.worker.compile import apply_train_compile, compiled_names

    base = {"name": "t", "data": {"path": "data/x"}}
    model = _tower_model()
    assert apply_train_compile(model, config_from_dict(base).train, log=True) == []
    assert compiled_names(model) == []
    cfg = config_from_dict(base, ["train.compile=dense", "train.compile_mode=reduce-overhead"])
    assert (cfg.train.compile, cfg.train.compile_mode) == ("dense", "reduce-overhead")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert apply_train_compile(model, cfg.train, log=True) == ["features.project", "tower", "head"]
    assert any("mode reduce-overhead: compiled features.project, tower, head" in r.getMessage()
               for r in caplog.records)
    assert compiled_names(model) == ["features.project", "tower", "head"]


@pytest.mark.parametrize("override, message", [
    ("train.compile=all", "train.compile: 'all' is unknown. Use one of ('none', 'dense')"),
    ("train.compile_mode=fast", "train.compile_mode: 'fast' is unknown. Use one of ('default', 'reduce-overhead', "
                                "'max-autotune')"),
])
def test_an_unknown_compile_setting_names_the_option_and_the_choices(override, message):
    from rayemb.config import config_from_dict
    from rayemb.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        config_from_dict({"name": "t", "data": {"path": "data/x"}}, [override])
    assert message in str(e.value)
