"""Sweeps: many rayemb jobs of one config, searched and scheduled by Ray Tune, tracked under one MLflow run.

``rayemb sweep --config job.yaml --space space.yaml`` (:mod:`rayemb.cli.sweep`) and :func:`rayemb.run_sweep`
run :func:`~rayemb.sweep.engine.run_sweep`; each trial is a whole rayemb job
(:func:`~rayemb.sweep.trial.sweep_trainable`), with its own plan, output folder and MLflow child run.

==================  =========================================================================================
module              what it holds
==================  =========================================================================================
``space``           ``space.yaml``: each config key's ``grid``/``choice``/``uniform``/``loguniform``/``randint``,
                    every value checked against the config before anything starts; Tune's search space
``trial``           the Tune function trainable: a job config per trial, run by the ``rayemb train`` driver,
                    its validations reported to Tune
``engine``          the sweep: its folder, the parent MLflow run, the scheduler (ASHA or FIFO), the search,
                    resuming, the trials' MLflow runs tagged and early-stopped ones marked KILLED
``best``            the best trial of a finished sweep and exporting its model
==================  =========================================================================================

Importing this package imports neither Ray nor MLflow.
"""
