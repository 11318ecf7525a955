"""The job's loss: binary cross-entropy per label column, weighted, or a loss of the user's.

A single-task model returns ``(B,)`` logits for the schema's one label; a
multi-task one ``(B, T)``, one column per label in the schema's order, and the
loss is ``sum_t w_t * BCE(logits[:, t], labels[:, t])`` (``train.task_weights``,
1 for every task not named). A loss of the user's (``train.loss``,
``"package.module:function"``, or ``EmbeddingTrainer(loss=...)``) gets the
model's whole output for the batch and the labels and returns a scalar: an
in-batch-negative loss sees every row at once.

The output's shape is checked against the labels' on every step (a shape is
host metadata: no device sync), so a model with the wrong number of outputs
stops at its first step with a message naming the fix.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from rayemb.errors import ConfigError


class TaskLoss:
    """``loss(output, labels)`` of a job with label columns ``tasks`` (see the module docstring)."""

    def __init__(self, tasks: Sequence[str], weights: Optional[Mapping[str, float]] = None,
                 user_loss: Optional[Callable[[Any, Any], Any]] = None) -> None:
        import torch

        self.tasks = list(tasks)
        self.user_loss = user_loss
        weights = dict(weights or {})
        self.weights = torch.tensor([float(weights.get(t, 1.0)) for t in self.tasks])
        self._bce = torch.nn.BCEWithLogitsLoss(reduction="none")
        self._mean_bce = torch.nn.BCEWithLogitsLoss()

    def _check(self, output: Any, labels: Any) -> None:
        if tuple(output.shape) != tuple(labels.shape):
            want = "(B,) logits" if len(self.tasks) == 1 else f"(B, {len(self.tasks)}) logits, one column per label"
            raise ConfigError(f"The model returned output of shape {tuple(output.shape)} for labels of shape "
                              f"{tuple(labels.shape)}: the schema's label column(s) {self.tasks} need {want} in "
                              "that order. Change the model's last layer (a factory reads schema.labels).",
                              "bad_model_output")

    def __call__(self, output: Any, labels: Any) -> Any:
        if self.user_loss is not None:
            return self.user_loss(output, labels)
        self._check(output, labels)
        if len(self.tasks) == 1:
            return self._mean_bce(output, labels)
        per_task = self._bce(output, labels).mean(dim=0)  # (T,)
        return (per_task * self.weights.to(per_task.device, per_task.dtype)).sum()


def job_loss(schema: Any, weights: Optional[Mapping[str, float]] = None,
             user_loss: Optional[Callable[[Any, Any], Any]] = None, item_feature: Optional[str] = None,
             table_stats: Optional[Mapping[str, Any]] = None, gather: bool = True) -> Callable[[Any, Any], Any]:
    """The job's loss: :class:`TaskLoss` for a ranking model; for a retrieval model (one naming an
    ``item_feature``) the user's loss, called with the rows' item ids, or the logQ-corrected in-batch softmax
    (:class:`rayemb.train.worker.retrieval.InBatchSoftmax`; ``table_stats``: the statistics pass's tables; ``gather``:
    negatives from every rank)."""
    if item_feature is None:
        return TaskLoss(schema.labels, weights, user_loss)
    if user_loss is not None:
        return user_loss
    from rayemb.train.worker.retrieval import InBatchSoftmax, item_log_q

    table = (table_stats or {}).get(item_feature)
    rows = schema.feature(item_feature).num_embeddings
    return InBatchSoftmax(None if table is None else item_log_q(table, rows), gather)


def check_tasks(tasks: Sequence[str], weights: Mapping[str, float], early_stopping_task: Optional[str]) -> None:
    """Every task the config names has a label column (ConfigError ``unknown_task`` naming the labels)."""
    named = {f"train.task_weights.{t}": t for t in weights}
    if early_stopping_task is not None:
        named["train.early_stopping_task"] = early_stopping_task
    unknown = {key: t for key, t in named.items() if t not in tasks}
    if unknown:
        raise ConfigError(f"{', '.join(f'{k}={t!r}' for k, t in unknown.items())}: no such label column. The "
                          f"schema's label column(s) are {list(tasks)}; name one of them, or add the column to "
                          "the data and to schema.yaml's `label: [...]`.", "unknown_task")


__all__ = ["TaskLoss", "job_loss", "check_tasks"]
