"""Real campaigns: the CLI, real mpiexec (oversubscribed), the real Triton executor."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from harness import EXAMPLES


@pytest.fixture(scope="session")
def build() -> Path:
    subprocess.run(["make", "-s", "-C", str(EXAMPLES)], check=True)
    return EXAMPLES / "build"


@pytest.fixture(autouse=True)
def _symcc_contract_scripts(monkeypatch):
    """Scripts under SymCC's contract (and the Triton shim) stand in for SymCC builds here:
    the check that `--executor symcc` gets a SymCC build is skipped, as AFL++'s
    AFL_SKIP_BIN_CHECK does (tests/unit/test_cli_errors.py tests the check itself)."""
    monkeypatch.setenv("SYMCC_MPI_SKIP_BIN_CHECK", "1")
