"""Resources run out cleanly (issue 9): a full output filesystem stops the campaign in one
line and `--resume` continues once there is room; the launcher leaves no process of its job
behind, whatever signals it gets; a stop request stops only its own run; a live directory
is refused before any MPI process starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import (
    ROOT,
    assert_oracles,
    done_digests,
    explore,
    rank_pid,
    start_explore,
    stats,
    verify,
)

from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME
from symcc_mpi.durable.storage import STOP_ADVICE, STORAGE_EXIT

sys.path.insert(0, str(ROOT / "tests" / "symcc"))
from realsymcc import BUILD, SEEDS, unavailable  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]


# -- helpers ---------------------------------------------------------------------------------


def mount_tmpfs(mountpoint: Path, size: str) -> None:
    mountpoint.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(mountpoint)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here (it needs root): "
                    f"{mounted.stderr.strip()}")


def resize(mountpoint: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mountpoint)], check=True)


@pytest.fixture
def disk(tmp_path):
    """A mount point for a small tmpfs, unmounted afterwards."""
    mountpoint = tmp_path / "disk"
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def fill(path: Path) -> None:
    """Write `path` until the filesystem is full (the campaign may have filled it first)."""
    try:
        with open(path, "wb") as filler:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    except OSError:
        pass


def generating_campaign(tmp_path: Path) -> list:
    """A campaign that fills a few megabytes quickly: the real SymCC build of the bundled
    JSON example when it is there, else a SymCC-contract target that writes 64 KiB inputs."""
    if unavailable() is None:
        return ["--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@", "--seeds",
                SEEDS / "json", "--workers", 2, "--timeout", 20]
    seeds = tmp_path / "seeds"
    seeds.mkdir(exist_ok=True)
    (seeds / "s").write_bytes(b"seed")
    target = tmp_path / "generator"
    target.write_text("#!/bin/sh\nfor i in 1 2 3; do head -c 65536 /dev/urandom > "
                      "\"$SYMCC_OUTPUT_DIR/$i\"; done\n")
    target.chmod(0o755)
    return ["--executor", "symcc", "--target", f"{target} @@", "--seeds", seeds,
            "--workers", 2, "--timeout", 20]


def slow_campaign(tmp_path: Path, inputs: int = 40) -> list:
    """A campaign that runs long and finds nothing: something to signal and to resume."""
    seeds = tmp_path / "seeds"
    seeds.mkdir(exist_ok=True)
    for i in range(inputs):
        (seeds / f"s{i}").write_bytes(b"%d" % i)
    slow = tmp_path / "slow-target"
    slow.write_text("#!/bin/sh\nsleep 0.5\n")
    slow.chmod(0o755)
    return ["--executor", "symcc", "--target", slow, "--seeds", seeds, "--workers", 2]


def without_seeds(args: list) -> list:
    at = args.index("--seeds")
    return args[:at] + args[at + 2:]


def job_processes(out: Path) -> list[int]:
    """Live processes of the campaign writing to `out`: launcher, mpiexec, ranks."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            state = open(f"/proc/{entry}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(out).encode() in cmdline and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def assert_nothing_left(out: Path, workers: int = 2) -> None:
    assert all(rank_pid(out, rank) is None for rank in range(workers + 1)), "a rank is left"
    assert not job_processes(out), [open(f"/proc/{pid}/cmdline").read()
                                    for pid in job_processes(out)]


def deferred_lines(out: Path) -> list[bytes]:
    journal = out / "state" / DEFERRED_JOURNAL_NAME
    return journal.read_bytes().splitlines() if journal.exists() else []


def storage_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if STOP_ADVICE in line]


# -- a full disk -----------------------------------------------------------------------------


def test_a_full_disk_stops_the_campaign_in_one_line_and_resume_finishes(disk, tmp_path):
    mount_tmpfs(disk, "3m")
    out = disk / "out"
    args = generating_campaign(tmp_path)
    process = explore(out, *args, timeout=600)
    output = process.stdout + process.stderr
    assert process.returncode == STORAGE_EXIT, output[-3000:]
    said = storage_lines(output)
    assert len(said) == 1, said
    assert f"no space left on device writing {out}/" in said[0], said
    assert "Traceback" not in output, output[-3000:]
    assert_nothing_left(out)
    assert deferred_lines(out) == [], "inputs deferred for a full disk"
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    analysed = set(done_digests(out))
    corpus = {p.name for p in (out / "corpus").iterdir()}

    resize(disk, "256m")
    resumed = explore(out, *without_seeds(args), "--resume", "--wall-timeout", 20,
                      timeout=600)
    assert_oracles(out, resumed)
    assert set(done_digests(out)) > analysed, "the resumed campaign analysed nothing"
    assert corpus <= {p.name for p in (out / "corpus").iterdir()}, "resume lost inputs"
    assert not storage_lines(resumed.stdout + resumed.stderr)


def test_sigterm_to_the_launcher_while_the_disk_is_full(disk, tmp_path):
    mount_tmpfs(disk, "32m")
    out = disk / "out"
    args = generating_campaign(tmp_path)
    launcher = start_explore(out, *args, analysed=2)
    fill(disk / "filler")
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # Either the stop request could not be written, or the master found the disk full first.
    assert ("cannot write the stop request (no space left on device writing "
            f"{out}/.stop-request): terminating the job") in output \
        or len(storage_lines(output)) == 1, output[-3000:]
    assert_nothing_left(out)
    assert deferred_lines(out) == []

    (disk / "filler").unlink(missing_ok=True)
    resize(disk, "256m")
    resumed = explore(out, *without_seeds(args), "--resume", "--wall-timeout", 20,
                      timeout=600)
    assert_oracles(out, resumed)


# -- signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGHUP,),
                                     (signal.SIGINT, signal.SIGINT),
                                     (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)],
                         ids=["term", "hup", "int-int", "int-term-hup"])
def test_the_launcher_leaves_no_process_of_its_job_whatever_signals_it_gets(tmp_path,
                                                                           signals):
    out = tmp_path / "out"
    args = slow_campaign(tmp_path)
    launcher = start_explore(out, *args, analysed=2)
    for signum in signals:
        launcher.send_signal(signum)
    output, _ = launcher.communicate(timeout=300)
    assert "Traceback" not in output, output[-3000:]
    assert_nothing_left(out)
    if len(signals) == 1:  # one signal: a clean stop of this run
        assert launcher.returncode == 0, output[-3000:]
        assert stats(out)["extra"]["stop_reason"] == "stop requested"
    resumed = explore(out, *without_seeds(args), "--resume", timeout=600)
    assert_oracles(out, resumed)


def test_sigterm_to_every_process_of_the_job_stops_it_cleanly(tmp_path):
    """What Slurm (scancel, preemption, the time limit) and systemd do: SIGTERM to every
    process at once. mpiexec must not take the ranks down (prterun kills them 0.5 s after its
    own SIGTERM) while the master drains its workers."""
    out = tmp_path / "out"
    args = slow_campaign(tmp_path)
    launcher = start_explore(out, *args, analysed=2)
    mpiexec = [pid for pid in job_processes(out)
               if pid != launcher.pid and rank_pid(out, 0) != pid
               and b"prterun" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]]
    assert len(mpiexec) == 1, mpiexec
    ranks = [rank_pid(out, rank) for rank in range(3)]
    os.kill(mpiexec[0], signal.SIGTERM)
    time.sleep(1.5)  # three times PRRTE's SIGCONT, SIGTERM, SIGKILL escalation
    assert launcher.poll() is None and [rank_pid(out, rank) for rank in range(3)] == ranks, \
        "mpiexec took the job down on SIGTERM"
    for pid in job_processes(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output[-3000:]
    assert stats(out)["extra"]["stop_reason"] in ("interrupted", "stop requested"), \
        output[-3000:]
    assert_nothing_left(out)
    assert verify(out).returncode == 0


# -- stop requests and a second campaign -----------------------------------------------------


@pytest.mark.parametrize("request_text, age", [(b"0123456789abcdef\n", 0), (b"", 3600)],
                         ids=["another-run", "touched-before-it-started"])
def test_a_stop_request_left_by_a_dead_run_does_not_stop_the_next(tmp_path, request_text,
                                                                  age):
    out = tmp_path / "out"
    args = slow_campaign(tmp_path, inputs=12)
    first = explore(out, *args, "--wall-timeout", 2)
    assert first.returncode == 0, first.stdout[-2000:]
    pending = stats(out)["pending"]
    assert pending > 0
    stale = out / ".stop-request"
    stale.write_bytes(request_text)
    then = time.time() - age
    os.utime(stale, (then, then))

    resumed = explore(out, *without_seeds(args), "--resume")
    assert_oracles(out, resumed)
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert f"removed {stale}: a stop request left by an earlier run" in \
        resumed.stdout + resumed.stderr
    assert not stale.exists()


def test_a_second_campaign_on_a_live_directory_is_refused_before_mpi(tmp_path):
    out = tmp_path / "out"
    args = slow_campaign(tmp_path)
    launcher = start_explore(out, *args, analysed=1)
    try:
        second = explore(out, *without_seeds(args), "--resume", timeout=120)
        lines = (second.stdout + second.stderr).strip().splitlines()
        assert second.returncode == 2
        assert lines == [f"symcc-mpi: error: another campaign is running in {out}"], lines
        assert launcher.poll() is None, "the running campaign was disturbed"
    finally:
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output[-3000:]
    assert_nothing_left(out)


def test_an_unexpected_error_in_the_master_ends_the_job_instead_of_hanging_it(tmp_path):
    out = tmp_path / "out"
    args = slow_campaign(tmp_path, inputs=12)
    first = explore(out, *args, "--wall-timeout", 2)
    assert first.returncode == 0, first.stdout[-2000:]
    (out / "stats.json").unlink()
    (out / "stats.json").mkdir()  # the master's first report fails: EISDIR, not storage
    resumed = explore(out, *without_seeds(args), "--resume", timeout=300)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode != 0, output[-3000:]
    assert "rank 0 failed; ending the job" in output, output[-3000:]
    assert_nothing_left(out)
