import logging

import pytest


@pytest.fixture
def quiet_dispatch_log():
    """Every recovery logs a warning; over thousands of runs (and shrinking) pytest would keep
    them all in memory. The unit tests check the log; the machines check only states."""
    logger = logging.getLogger("symcc_mpi.dispatch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
