"""A hybrid campaign on a target built with real SymCC, beside real AFL++ (issue 12)."""

from __future__ import annotations

import signal
import subprocess

import pytest
from harness import EXAMPLES, crash_files, hybrid_beside_afl, stats, verify

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(600)]


def test_beside_afl_with_real_symcc(symcc_build, tmp_path):
    sync_dir = tmp_path / "afl"
    ours = sync_dir / "symcc-mpi"
    launcher, output = hybrid_beside_afl(sync_dir, executor="symcc",
                                         target=symcc_build / "gate.symcc",
                                         afl_build=symcc_build / "gate.afl",
                                         seeds=EXAMPLES / "seeds" / "gate")
    assert launcher.returncode == 0, output
    checked = verify(ours)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    figures = stats(ours)["extra"]["hybrid"]
    assert figures["imported"].get("main", 0) > 0
    assert figures["imported_by"]["main"] > 0
    crashed = [subprocess.run([str(symcc_build / "gate"), str(path)]).returncode
               for path in crash_files(ours)]
    assert -signal.SIGSEGV in crashed
