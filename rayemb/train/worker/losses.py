"""The job's loss: per label column binary cross-entropy or a regression loss, weighted, or a loss of the user's.

A single-task model returns ``(B,)`` outputs for the schema's one label; a
multi-task one ``(B, T)``, one column per label in the schema's order, and the
loss is ``sum_t w_t * L_t(output[:, t], labels[:, t])`` (``train.task_weights``,
1 for every task not named). ``L_t`` is binary cross-entropy on the logit for a
binary task, and for a regression task (schema.yaml ``task_types``) MSE or
Huber on the raw output (``train.regression_loss``).

A schema.yaml ``weight`` column makes each task's loss the weighted mean over the
rows, ``sum_i r_i * l_i / sum_i r_i``: the step hands the loss the labels with the
rows' weights as one more last column (:func:`loss_target`), so the loss takes
``(output, target)`` whether or not the data has weights. A batch whose weights
sum to 0 has loss 0. A loss of the user's (``train.loss``,
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

BINARY, REGRESSION = "binary", "regression"
#: train.regression_loss -> the elementwise loss of a regression task (rayemb.config.REGRESSION_LOSSES)
REGRESSION_LOSSES = ("mse", "huber")


def loss_target(batch: Any) -> Any:
    """What the step hands :class:`TaskLoss` besides the output: ``batch.labels``, with ``batch.weights`` (a
    schema.yaml ``weight`` column) stacked on as one more last column."""
    import torch

    if getattr(batch, "weights", None) is None:
        return batch.labels
    labels = batch.labels if batch.labels.dim() == 2 else batch.labels.unsqueeze(1)
    return torch.cat([labels, batch.weights.to(labels.dtype).unsqueeze(1)], dim=1)


class TaskLoss:
    """``loss(output, target)`` of a job with label columns ``tasks`` (see the module docstring).

    ``task_types``: each task's ``binary`` or ``regression`` (None: every task binary); ``regression_loss``: ``mse``
    or ``huber``."""

    def __init__(self, tasks: Sequence[str], weights: Optional[Mapping[str, float]] = None,
                 user_loss: Optional[Callable[[Any, Any], Any]] = None, task_types: Optional[Sequence[str]] = None,
                 regression_loss: str = "mse") -> None:
        import torch

        self.tasks = list(tasks)
        self.user_loss = user_loss
        weights = dict(weights or {})
        self.weights = torch.tensor([float(weights.get(t, 1.0)) for t in self.tasks])
        self.task_types = list(task_types or [BINARY] * len(self.tasks))
        if len(self.task_types) != len(self.tasks) or set(self.task_types) - {BINARY, REGRESSION}:
            raise ValueError(f"task_types {self.task_types} for tasks {self.tasks}: one of {BINARY!r} or "
                             f"{REGRESSION!r} per task")
        if regression_loss not in REGRESSION_LOSSES:
            raise ConfigError(f"Invalid config value train.regression_loss: {regression_loss!r} is unknown. Use one "
                              f"of {REGRESSION_LOSSES}.")
        self.regression_loss = regression_loss
        self._binary_only = all(t == BINARY for t in self.task_types)
        self._bce = torch.nn.BCEWithLogitsLoss(reduction="none")
        self._mean_bce = torch.nn.BCEWithLogitsLoss()
        self._regression = (torch.nn.MSELoss(reduction="none") if regression_loss == "mse"
                            else torch.nn.HuberLoss(reduction="none", delta=1.0))

    def _split(self, target: Any) -> Any:
        """(labels, row weights or None) of ``target``: the labels alone, or with the weights as a last column."""
        columns = len(self.tasks)
        weighted = target.dim() == 2 and target.shape[1] == columns + 1
        if not weighted:
            return target, None
        labels = target[:, 0] if columns == 1 else target[:, :columns]
        return labels, target[:, columns]

    def _elementwise(self, output: Any, labels: Any) -> Any:
        """(B, T) loss of every row and task."""
        import torch

        out, y = output.reshape(output.shape[0], -1), labels.reshape(labels.shape[0], -1)
        if self._binary_only:
            return self._bce(out, y)
        return torch.stack([self._bce(out[:, i], y[:, i]) if kind == BINARY else self._regression(out[:, i], y[:, i])
                            for i, kind in enumerate(self.task_types)], dim=1)

    def _check(self, output: Any, labels: Any) -> None:
        if tuple(output.shape) != tuple(labels.shape):
            want = "(B,) logits" if len(self.tasks) == 1 else f"(B, {len(self.tasks)}) logits, one column per label"
            raise ConfigError(f"The model returned output of shape {tuple(output.shape)} for labels of shape "
                              f"{tuple(labels.shape)}: the schema's label column(s) {self.tasks} need {want} in "
                              "that order. Change the model's last layer (a factory reads schema.labels).",
                              "bad_model_output")

    def __call__(self, output: Any, target: Any) -> Any:
        labels, rows = self._split(target)
        if self.user_loss is not None:
            return self.user_loss(output, labels)
        self._check(output, labels)
        if rows is None and self._binary_only and len(self.tasks) == 1:
            return self._mean_bce(output, labels)
        losses = self._elementwise(output, labels)  # (B, T)
        if rows is None:
            per_task = losses.mean(dim=0)
        else:
            rows = rows.to(losses.dtype)
            per_task = (losses * rows.unsqueeze(1)).sum(dim=0) / rows.sum().clamp_min(1e-12)
        if len(self.tasks) == 1:
            return per_task[0]
        return (per_task * self.weights.to(per_task.device, per_task.dtype)).sum()


def job_loss(schema: Any, weights: Optional[Mapping[str, float]] = None,
             user_loss: Optional[Callable[[Any, Any], Any]] = None, item_feature: Optional[str] = None,
             table_stats: Optional[Mapping[str, Any]] = None, gather: bool = True,
             regression_loss: str = "mse") -> Callable[[Any, Any], Any]:
    """The job's loss: :class:`TaskLoss` for a ranking model (each label's task type from the schema,
    ``regression_loss``: ``train.regression_loss``); for a retrieval model (one naming an ``item_feature``) the
    user's loss, called with the rows' item ids, or the logQ-corrected in-batch softmax
    (:class:`rayemb.train.worker.retrieval.InBatchSoftmax`; ``table_stats``: the statistics pass's entries, one per
    feature: the item column's own counts, which a history column reading the item table does not swell;
    ``gather``: negatives from every rank)."""
    if item_feature is None:
        kinds = getattr(schema, "task_kinds", None)
        return TaskLoss(schema.labels, weights, user_loss, task_types=kinds, regression_loss=regression_loss)
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


__all__ = ["TaskLoss", "job_loss", "check_tasks", "loss_target"]
