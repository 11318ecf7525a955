"""DLRM (Naumov et al., 2019, arXiv:1906.00091) over a pluggable embedding module.

``bottom MLP(dense) ─┐
                     ├─ pairwise dot interaction ─ top MLP ─ logit``
``embedding(KJT) ────┘``

The embedding module is anything that maps a ``KeyedJaggedTensor`` to a
``KeyedTensor`` of pooled ``(B, D)`` embeddings per feature: a TorchRec
``EmbeddingBagCollection`` or rayemb's hybrid embedding. TorchRec's ``DenseArch``
and ``OverArch`` are reused as they are; the interaction is
:class:`PairwiseDotInteraction`, TorchRec's ``InteractionArch`` computed faster
(same values, same order).

With sequence features (``model.sequence_tower``, docs/sequence.md) the DLRM
has a ``sequence`` child, an ``EmbeddingCollection`` of the sequence tables
(the attribute name is part of the checkpoint keys,
``sequence.embeddings.<table>.weight``), and a parameter-free
:class:`~rayemb.embedding.sequence.UserHistoryTower` that pools each padded
history (against its target feature's pooled embedding for ``attention``) into
one more ``(B, D)`` vector of the interaction::

    pooled (B, F, D) ++ tower(history, target) (B, S, D) → pairwise dots

As a model factory (``model.name: dlrm``) it is :func:`dlrm`, built on the
public model contract only (:class:`rayemb.Embeddings`), like any user's model.

Example::

    >>> ebc = EmbeddingBagCollection(tables=[...], device=torch.device("meta"))
    >>> model = DLRM(ebc, feature_names=["C1", "C2"], dense_in_features=13,
    ...              bottom_mlp=[64, 16], top_mlp=[64, 1])
    >>> logits = model(dense, kjt)          # (B,)
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, OverArch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rayemb import DatasetSchema, Embeddings, SequenceFeature, UserHistoryTower, pad_sequences


class PairwiseDotInteraction(nn.Module):
    """DLRM's dot interaction: ``[dense, upper triangle of C·Cᵀ]`` with ``C = (dense, v_1, ..., v_F)`` stacked.

    The same values in the same order as TorchRec's ``InteractionArch``, built
    with one copy fewer (dense and sparse vectors stacked at once, not stacked
    then concatenated) and the pairs taken by one ``index_select`` on the
    flattened Gram matrix: its backward is an ``index_add``, where TorchRec's
    advanced indexing ``gram[:, rows, cols]`` backs into an accumulating
    ``index_put``, the largest single operator of the default job's CPU step;
    this interaction's forward + backward is faster (jobs/bench/interaction.py).
    """

    def __init__(self, num_vectors: int) -> None:
        super().__init__()
        n = num_vectors + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        # flat positions of the pairs (i < j) in the row-major n x n Gram matrix; not part of checkpoints
        self.register_buffer("pair_index", rows * n + cols, persistent=False)

    def forward(self, dense: torch.Tensor, vectors: List[torch.Tensor]) -> torch.Tensor:
        return self.stacked(dense, torch.stack([dense] + vectors, dim=1))

    def stacked(self, dense: torch.Tensor, combined: torch.Tensor) -> torch.Tensor:
        """The interaction of ``combined``, ``(B, 1 + F, D)``: ``dense`` then the vectors."""
        gram = torch.bmm(combined, combined.transpose(1, 2))
        return torch.cat((dense, gram.flatten(1).index_select(1, self.pair_index)), dim=1)


class DLRM(nn.Module):
    def __init__(
        self,
        embedding: nn.Module,
        feature_names: Sequence[str],
        dense_in_features: int,
        bottom_mlp: Sequence[int],
        top_mlp: Sequence[int],
        dense_device: Optional[torch.device] = None,
        sequence: Optional[nn.Module] = None,
        sequence_features: Sequence[SequenceFeature] = (),
        sequence_targets: Optional[Mapping[str, Optional[str]]] = None,
        sequence_tower: str = "attention",
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.feature_names: List[str] = list(feature_names)
        self.sequence_features: List[SequenceFeature] = list(sequence_features)
        #: sequence feature -> the pooled feature its history is compared with (None: no target)
        self.sequence_targets: Dict[str, Optional[str]] = {f.name: (sequence_targets or {}).get(f.name)
                                                           for f in self.sequence_features}
        if (sequence is None) != (not self.sequence_features):
            raise ValueError("pass both the sequence EmbeddingCollection and its sequence_features, or neither")
        self.has_sequence = sequence is not None
        if sequence is not None:
            self.sequence = sequence  # checkpoint keys: sequence.embeddings.<table>.weight
            self.history_tower = UserHistoryTower(sequence_tower)
        num_vectors = len(self.feature_names) + len(self.sequence_features)
        dim = bottom_mlp[-1]
        self.dense_arch = DenseArch(dense_in_features, list(bottom_mlp), device=dense_device)
        self.inter_arch = PairwiseDotInteraction(num_vectors)
        over_in = dim + (num_vectors + 1) * num_vectors // 2
        self.over_arch = OverArch(over_in, list(top_mlp), device=dense_device)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor,
                sequence: Optional[KeyedJaggedTensor] = None) -> torch.Tensor:
        dense_out = self.dense_arch(dense)
        embedded = self.embedding(sparse)
        values = embedded.values()
        batch, dim = dense_out.shape[0], dense_out.shape[1]
        if not self.has_sequence and embedded.keys() == self.feature_names and \
                values.shape[1] == len(self.feature_names) * dim:
            # the pooled vectors already lie side by side in feature order: one copy stacks them with the dense
            # one, where splitting them per feature and stacking the pieces costs two operators per table
            combined = torch.cat([dense_out, values], dim=1).view(batch, 1 + len(self.feature_names), dim)
            return self.over_arch(self.inter_arch.stacked(dense_out, combined)).squeeze(-1)
        pooled = embedded.to_dict()
        vectors = [pooled[f] for f in self.feature_names]
        if not torch.jit.is_scripting():  # TorchScript skips this block: plain DLRMs stay scriptable (export)
            if self.has_sequence:
                vectors.extend(self._history_vectors(pooled, sequence))
        return self.over_arch(self.inter_arch(dense_out, vectors)).squeeze(-1)  # vectors: F (+ S) of (B, D)

    def _history_vectors(self, pooled: Dict[str, torch.Tensor],
                         sequence: Optional[KeyedJaggedTensor]) -> List[torch.Tensor]:
        """One ``(B, D)`` tower output per sequence feature."""
        if sequence is None:
            raise ValueError("this DLRM has sequence features; pass their KJT (Batch.sequence) as `sequence`")
        padded = pad_sequences(self.sequence(sequence), self.sequence_features)
        out = []
        for f in self.sequence_features:
            history, mask = padded[f.name]
            target = self.sequence_targets[f.name]
            out.append(self.history_tower(history, mask, pooled[target] if target else None))
        return out


def dlrm(embeddings: Embeddings, schema: DatasetSchema, bottom_mlp: Sequence[int] = (64, 16),
         top_mlp: Sequence[int] = (64, 32, 1), sequence_tower: str = "attention") -> DLRM:
    """The DLRM factory (``model.name: dlrm``; ``model.bottom_mlp`` / ``model.top_mlp`` / ``model.sequence_tower``
    are its arguments): bottom MLP over the dense features, the pooled (and history) vectors, dot interaction,
    top MLP to one logit per label column (a multi-task schema shares everything below the last layer).

    The dot interaction needs every pooled vector as wide as the bottom MLP's output: tables of other dims
    (schema.yaml ``embedding_dim``) are refused, naming the features (the driver says so before any work,
    :func:`rayemb.contract.factory.check_table_dims`)."""
    off = {f: d for f, d in zip(embeddings.features, embeddings.dims) if d != bottom_mlp[-1]}
    if off:
        raise ValueError(f"dlrm: its dot interaction needs every pooled vector {bottom_mlp[-1]} wide (bottom_mlp's "
                         f"last size), but features {off} are not; drop their embedding_dim in schema.yaml, or use "
                         "model.name: dcn_v2 or two_tower, which concatenate vectors of any width")
    top = [*top_mlp[:-1], len(schema.labels)]
    return DLRM(embeddings.pooled, feature_names=embeddings.features, dense_in_features=len(schema.dense),
                bottom_mlp=bottom_mlp, top_mlp=top, dense_device=embeddings.device,
                sequence=embeddings.sequence, sequence_features=embeddings.sequence_features,
                sequence_targets={f.name: f.target for f in schema.sequence},
                sequence_tower=sequence_tower if embeddings.sequence_features else "mean")
