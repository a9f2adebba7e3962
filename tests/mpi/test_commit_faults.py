"""The done journal under real campaigns: the master SIGKILLed inside a group commit, then
--resume; and `symcc-mpi verify`/`status` run in a loop against a live campaign whose journal
has a torn tail (an append held open by a fault), which they must leave byte for byte alone."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from harness import ROOT, assert_oracles, done_digests, explore, stats

from symcc_mpi.roles.faults import RELEASE_FILE

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

KILL_STEPS = ["before-children-sync", "before-done-append", "after-done-fsync"]


def arguments(build, fault_tolerance="on"):
    return ["--target", f"{build / 'checksum'} @@", "--seeds",
            build.parent / "seeds" / "checksum", "--workers", 2, "--timeout", 20,
            "--fault-tolerance", fault_tolerance]


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_master_killed_inside_a_group_commit_resumes_losing_and_repeating_nothing(
        build, tmp_path, step):
    # Without fault tolerance the job ends with its master; --resume continues it.
    out = tmp_path / "out"
    args = arguments(build, "off")
    killed = explore(out, *args, env=dict(os.environ, SYMCC_MPI_FAULTS=f"0:kill-{step}@2"))
    output = killed.stdout + killed.stderr
    assert killed.returncode != 0, output
    assert "continue with --resume" in output
    assert f"fault: SIGKILL of the master {step} of group commit 2" in output
    analysed_before = done_digests(out)
    corpus_before = {p.name for p in (out / "corpus").iterdir()}
    # The first commit is whole; the second, killed at `step`, appended its records only if
    # the kill came after its fsync.
    assert analysed_before, "the first group commit is missing"

    process = explore(out, *args, "--resume")
    assert_oracles(out, process)  # verify OK, no input twice in the done journal
    done = done_digests(out)
    assert set(done) >= set(analysed_before) and len(done) == len(set(done))
    corpus = {p.name for p in (out / "corpus").iterdir()}
    assert corpus_before <= corpus, "resume lost a published input"
    assert set(done) == corpus, "an input was never analysed"
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_master_killed_inside_a_group_commit_is_replaced_losing_and_repeating_nothing(
        build, tmp_path, step):
    # Under ULFM a worker takes the campaign over from OUT and finishes it in the same job.
    out = tmp_path / "out"
    process = explore(out, *arguments(build),
                      env=dict(os.environ, SYMCC_MPI_FAULTS=f"0:kill-{step}@2"))
    assert f"fault: SIGKILL of the master {step} of group commit 2" in process.stdout
    assert_oracles(out, process)
    figures = stats(out)
    assert [f["master"] for f in figures["extra"]["failures"]] == ["new"]
    done = done_digests(out)
    assert set(done) == {p.name for p in (out / "corpus").iterdir()}
    assert figures["extra"]["stop_reason"] == "frontier exhausted"


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "symcc_mpi", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_verify_and_status_in_a_loop_never_touch_a_live_campaigns_journal(build, tmp_path):
    out = tmp_path / "out"
    journal = out / "state" / "done.jsonl"
    environment = dict(os.environ, SYMCC_MPI_FAULTS="0:torn-done-append@2")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "symcc_mpi", "explore", "--out", str(out), "--no-live",
         *map(str, arguments(build))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=environment)
    readers: list[subprocess.CompletedProcess] = []
    saw_torn = threading.Event()
    stop = threading.Event()

    def read_in_a_loop() -> None:
        while not stop.is_set():
            if not (out / ".symcc-mpi").exists():
                time.sleep(0.05)
                continue
            for command in ("verify", "status"):
                result = run_cli(command, out)
                readers.append(result)
                if "torn last line" in result.stdout:
                    saw_torn.set()

    reader = threading.Thread(target=read_in_a_loop)
    reader.start()
    try:
        # The master holds its 2nd group commit's append half written until released.
        deadline = time.monotonic() + 300
        torn = b""
        while time.monotonic() < deadline and launcher.poll() is None:
            torn = journal.read_bytes() if journal.exists() else b""
            if torn and not torn.endswith(b"\n"):
                break
            time.sleep(0.05)
        assert torn and not torn.endswith(b"\n"), "the torn append never showed"
        # Not a race: the append stays torn until this test releases it.
        assert saw_torn.wait(timeout=300), "no verify ran while the tail was torn"
        assert journal.read_bytes() == torn, "a reader changed the journal"
        (out / RELEASE_FILE).touch()
        output, _ = launcher.communicate(timeout=300)
    finally:
        stop.set()
        reader.join()
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output
    final = journal.read_bytes()
    assert final.startswith(torn)
    # The campaign's own account of what it wrote: records, size and SHA-256.
    written = re.search(r"done\.jsonl: (\d+) records, (\d+) bytes, sha256 ([0-9a-f]{64}), "
                        r"as this campaign wrote it", output)
    assert written, output[-3000:]
    assert int(written[2]) == len(final)
    assert written[3] == hashlib.sha256(final).hexdigest()
    assert "changed under the campaign" not in output
    assert not list((out / "quarantine").glob("done.jsonl*")) \
        if (out / "quarantine").exists() else True
    assert readers
    tracebacks = [r.stderr for r in readers if "Traceback" in r.stderr]
    assert not tracebacks, tracebacks[0]
    assert any("torn last line" in r.stdout for r in readers if r.args[3] == "verify")
    (out / RELEASE_FILE).unlink()
    assert_oracles(out, subprocess.CompletedProcess(launcher.args, 0, output, ""))
