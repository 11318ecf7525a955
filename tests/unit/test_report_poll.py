"""A job's Ray Train controller polls its workers every 0.2 s (rayemb.train.driver.trainer): a rank's ``ray.train.report``
waits for that poll, so checkpoints do not stall training for Ray's default 2 s; a user's own setting wins."""

import os

from ray.train.v2._internal import constants

from rayemb.train.driver import trainer


def test_the_variable_is_the_one_ray_train_reads_and_passes_to_its_controller():
    assert trainer._POLL_ENV == constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR
    assert trainer._POLL_ENV in constants.ENV_VARS_TO_PROPAGATE
    assert float(trainer.REPORT_POLL_INTERVAL_S) < constants.DEFAULT_HEALTH_CHECK_INTERVAL_S


def test_set_for_fit_only_and_a_users_value_kept(monkeypatch):
    monkeypatch.delenv(trainer._POLL_ENV, raising=False)
    with trainer._report_poll_interval():
        assert constants.get_env_vars_to_propagate()[trainer._POLL_ENV] == trainer.REPORT_POLL_INTERVAL_S
    assert trainer._POLL_ENV not in os.environ
    monkeypatch.setenv(trainer._POLL_ENV, "1.5")
    with trainer._report_poll_interval():
        assert os.environ[trainer._POLL_ENV] == "1.5"
    assert os.environ[trainer._POLL_ENV] == "1.5"
