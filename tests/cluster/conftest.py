"""Cluster paths proven on one machine (issue 15): a one-node Slurm of the tests' own
(slurm_cluster.py), and real campaigns across "hosts" whose PRRTE daemons are started through
fake_rsh (a stand-in for ssh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mpi"))  # harness.py

from harness import EXAMPLES  # noqa: E402


@pytest.fixture(scope="session")
def build() -> Path:
    subprocess.run(["make", "-s", "-C", str(EXAMPLES)], check=True)
    return EXAMPLES / "build"
