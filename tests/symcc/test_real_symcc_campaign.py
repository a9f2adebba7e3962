"""A real 2-worker campaign through the CLI with the SymCC executor finds a planted bug."""

from __future__ import annotations

import shutil
import time

import pytest
from harness import assert_oracles, crash_files, crashes_natively, explore, stats
from realsymcc import BUILD, SEEDS

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


@pytest.mark.skipif(shutil.which("afl-showmap") is None, reason="AFL++ not installed")
def test_symcc_campaign_finds_the_json_label_overrun(tmp_path):
    """From the seeds the overrun is a surrogate pair away (two escapes to rewrite, each
    over several branches); measured on 2 busy cores: found after ~10 s, the campaign
    saturates after ~25 s."""
    if not (BUILD / "json.afl").exists():
        pytest.skip("no AFL build of the json example")
    out = tmp_path / "out"
    started = time.monotonic()
    process = explore(out, "--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@",
                      "--afl-target", f"{BUILD / 'json.afl'} @@", "--seeds", SEEDS / "json",
                      "--workers", 2, "--timeout", 20, "--wall-timeout", 120, timeout=200)
    elapsed = time.monotonic() - started
    assert_oracles(out, process)
    crashes = crash_files(out)
    assert crashes, f"no crash after {elapsed:.0f} s: {process.stdout[-2000:]}"
    for crash in crashes:
        data = crash.read_bytes()
        assert crashes_natively(BUILD / "json", data, tmp_path), data
        assert b'"x-\\u' in data, data  # the overrun is only reachable through such a key
    figures = stats(out)
    assert figures["executions"] > 0 and figures["edges_found"] > 0
