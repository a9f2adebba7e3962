"""Tests against a real SymCC (QSYM backend) built by `make symcc` (README: Getting SymCC).

Without the SymCC builds of the examples every test here is skipped, with one reason, unless
SYMCC_MPI_REQUIRE_SYMCC=1 (which `make test` sets when it has a SymCC source): then they
fail, so that CI never passes by silently skipping them.
"""

from __future__ import annotations

import sys

import pytest
from realsymcc import BUILD, ROOT, unavailable

sys.path.insert(0, str(ROOT / "tests" / "mpi"))  # the campaign helpers (harness.py)

UNAVAILABLE = unavailable()


@pytest.fixture(autouse=True)
def _real_symcc_available():
    if UNAVAILABLE is not None:
        action, why = UNAVAILABLE
        (pytest.fail if action == "fail" else pytest.skip)(why)


@pytest.fixture(scope="session")
def symcc_build():
    return BUILD
