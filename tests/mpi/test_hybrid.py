"""Hybrid campaigns beside real AFL++ (`explore --afl-sync`), with the Triton executor: each
side takes the other's finds, the planted bug behind a 32-bit key is found, and a resumed
campaign imports and analyses nothing twice."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess

import pytest
from harness import (
    EXAMPLES,
    crash_files,
    done_digests,
    hybrid_beside_afl,
    queue_names,
    start_hybrid,
    stats,
    verify,
)

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(600)]

BUILD = EXAMPLES / "build"


def test_beside_afl_with_triton_then_resumed(tmp_path):
    sync_dir = tmp_path / "afl"
    ours = sync_dir / "symcc-mpi"
    launcher, output = hybrid_beside_afl(sync_dir, executor="triton", target=BUILD / "gate",
                                         afl_build=BUILD / "gate.afl",
                                         seeds=EXAMPLES / "seeds" / "gate")
    assert launcher.returncode == 0, output
    assert "imported by main" in output and "imported from fuzzers" in output, output
    checked = verify(ours)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    first = stats(ours)
    assert first["extra"]["stop_reason"] == "stop requested"
    hybrid = first["extra"]["hybrid"]
    assert hybrid["imported"].get("main", 0) > 0
    assert hybrid["imported_by"]["main"] > 0
    crashed = [subprocess.run([str(BUILD / "gate"), str(path)]).returncode
               for path in crash_files(ours)]
    assert -signal.SIGSEGV in crashed

    analysed_before = set(done_digests(ours))
    cursors_before = json.loads((ours / "state" / "afl-sync.json").read_text())["cursors"]
    # The fuzzers are gone: what is left in their queues was read already.
    resumed = start_hybrid(sync_dir, "--executor", "triton", "--target", f"{BUILD / 'gate'} @@",
                           "--afl-target", f"{BUILD / 'gate.afl'} @@", "--workers", 2,
                           "--wall-timeout", 8, "--resume")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    checked = verify(ours)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Entries the fuzzers wrote after the last scan are new; none read before is read again.
    imported = [name.split(",")[1:3] for name in queue_names(ours / "queue") if ",sync:" in name]
    sources = [(sync.removeprefix("sync:"), int(src.removeprefix("src:")))
               for sync, src in imported]
    assert len(sources) == len(set(sources)), "an AFL entry was imported twice"
    again = stats(ours)["extra"]["hybrid"]["imported"]
    late = sources[len(sources) - sum(again.values()):]
    assert all(entry_id >= cursors_before.get(instance, 0) for instance, entry_id in late), \
        (late, cursors_before)
    done = done_digests(ours)
    assert len(done) == len(set(done)), "an input was analysed twice"
    assert set(done) >= analysed_before
    contents = [hashlib.sha256((ours / "queue" / n).read_bytes()).hexdigest()
                for n in queue_names(ours / "queue")]
    assert len(contents) == len(set(contents)), "queue/ holds an input twice"
