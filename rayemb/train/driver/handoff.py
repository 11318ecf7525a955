"""The worker job handed to Ray Train's workers once it is ready, so that they can be launched before it is.

Ray Train's worker group takes seconds to start (its controller, the worker processes, their imports, the
process group). A job whose plan measures nothing more on the cluster (its calibration and plan probe kept from
an earlier job) launches the group first and makes its plan and MLflow run meanwhile; each worker's loop
(:func:`rayemb.train.worker.loop.worker_loop`) waits on a :class:`JobHandoff`'s reference, which resolves to the
:class:`~rayemb.train.worker_job.WorkerJob` when the driver hands it over, or to None when the driver's stage
failed (the workers then end at once, and the driver raises that stage's error).

The reference is one Ray object: a restarted worker group (``max_failures``) reads the same job again.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional


class _Slot:
    """One value, set once; every ``get`` waits for it (an async actor: the waiting calls hold no thread)."""

    def __init__(self) -> None:
        self._ready = asyncio.Event()
        self._value: Any = None

    async def get(self) -> Any:
        await self._ready.wait()
        return self._value

    async def put(self, value: Any) -> None:
        self._value = value
        self._ready.set()


class JobHandoff:
    """A reference the workers get before the job exists (:attr:`ref`); :meth:`hand` resolves it, once.

    The actor is on the driver's node (a worker node may go, the driver's job with it) and takes no CPU."""

    def __init__(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._actor = ray.remote(_Slot).options(num_cpus=0, scheduling_strategy=here).remote()
        #: what each worker's loop is given: resolves to the WorkerJob, or None when the driver failed first
        self.ref = self._actor.get.remote()
        self._handed = False

    @property
    def handed(self) -> bool:
        return self._handed

    def hand(self, job: Optional[Any]) -> None:
        """Resolves :attr:`ref` to ``job`` (None: the driver failed before it was ready; the workers end)."""
        import ray

        if self._handed:
            return
        self._handed = True
        ray.get(self._actor.put.remote(job))

    def close(self) -> None:
        """Ends the actor (the reference's value, once resolved, is the driver's and stays)."""
        import ray

        if not self._handed:  # a worker still waiting must not wait for ever
            try:
                self.hand(None)
            except Exception:  # noqa: BLE001 - the actor is going anyway
                pass
        try:
            ray.kill(self._actor)
        except Exception:  # noqa: BLE001 - already gone with its node or the cluster
            pass


__all__ = ["JobHandoff"]
