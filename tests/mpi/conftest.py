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
