"""--scratch under real mpiexec: each worker's temporary files stay in a directory of its own
under DIR, OUT gets only its staging, and a DIR a rank cannot use is said in one line.

What a worker keeps in DIR is looked at while both workers are held after their first run
(SYMCC_MPI_FAULTS pause@1=release): the campaign cannot move on before the test has looked,
so no observation depends on how fast the machine runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, assert_oracles, explore, explore_command, stats

from symcc_mpi.campaign.layout import MARKER
from symcc_mpi.durable.atomic import is_temporary
from symcc_mpi.roles.faults import HELD_FILE, RELEASE_FILE

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

# What a campaign directory holds (corpus.py, report.py), and nothing a worker makes.
LAYOUT = {".staging", MARKER, "aside", "corpus", "queue", "crashes", "hangs", "state", "quarantine",
          "fuzzer_stats", "plot_data", "stats.json"}


def _master_temporary(name: str) -> bool:
    """A whole-file write of the master's in progress (durable/atomic.py, report.py)."""
    return is_temporary(Path(name)) or any(name.startswith(f".{n}.") for n in LAYOUT)


def _fault_protocol(name: str) -> bool:
    """The files by which the held workers and this test speak (roles/faults.py)."""
    return name == RELEASE_FILE or name.startswith(HELD_FILE.format(""))


def _tmpdirs_under(root: Path) -> set[str]:
    """The TMPDIR of every process whose TMPDIR lies under `root`: executors' children."""
    found = set()
    prefix = b"TMPDIR=" + str(root).encode() + b"/"
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            found |= {v[len(b"TMPDIR="):].decode() for v in environ if v.startswith(prefix)}
    return found


def test_workers_keep_their_files_under_scratch_and_only_stage_in_out(build, tmp_path):
    scratch, started_in, out = tmp_path / "scratch", tmp_path / "cwd", tmp_path / "out"
    scratch.mkdir()
    started_in.mkdir()  # the directory the campaign is started from (on a cluster, shared)
    args = ["--target", f"{build / 'tlv'} @@", "--afl-target", f"{build / 'tlv.afl'} @@",
            "--workers", 2, "--timeout", 20]
    # Two seeds, so that each worker is sent one at once and both can be held.
    seed_dir = tmp_path / "seeds"
    seed_dir.mkdir()
    seed = next((build.parent / "seeds" / "tlv").iterdir()).read_bytes()
    (seed_dir / "a").write_bytes(seed)
    (seed_dir / "b").write_bytes(seed + b"\x00")
    seeds = ["--seeds", seed_dir]
    held = [out / HELD_FILE.format(rank) for rank in (1, 2)]
    environment = dict(os.environ, SYMCC_MPI_FAULTS="1:pause@1=release,2:pause@1=release")
    launcher = subprocess.Popen(explore_command(out, [*args, *seeds, "--scratch", scratch]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=started_in, env=environment)
    in_scratch: set[str] = set()  # entries of DIR, then of each worker's directory in it
    in_workers: set[str] = set()
    stray_in_out: set[str] = set()
    stray_in_cwd: set[str] = set()
    tmpdirs: set[str] = set()
    looked_while_held = False
    while launcher.poll() is None:
        both_held = not looked_while_held and all(path.exists() for path in held)
        entries = set(os.listdir(scratch))
        in_scratch |= entries
        for name in entries:
            if name.startswith("symcc-mpi-w"):
                try:
                    in_workers |= set(os.listdir(scratch / name))
                except FileNotFoundError:
                    pass
        if out.is_dir():
            stray_in_out |= {n for n in os.listdir(out) if n not in LAYOUT
                             and not _master_temporary(n) and not _fault_protocol(n)}
        stray_in_cwd |= set(os.listdir(started_in))
        if both_held:  # everything above was seen with both workers held: let them go
            tmpdirs |= _tmpdirs_under(scratch)
            looked_while_held = True
            (out / RELEASE_FILE).touch()
        elif looked_while_held and (out / RELEASE_FILE).exists() \
                and not any(path.exists() for path in held):
            (out / RELEASE_FILE).unlink()
        try:
            launcher.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    output, _ = launcher.communicate()
    process = subprocess.CompletedProcess(launcher.args, launcher.returncode, output, "")
    assert looked_while_held, output
    (out / RELEASE_FILE).unlink(missing_ok=True)  # the campaign ended before it was removed
    assert_oracles(out, process)  # `symcc-mpi verify OUT` passes, .staging is empty
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"

    workers = sorted(n for n in in_scratch if n.startswith("symcc-mpi-w"))
    assert [n.split("-")[2] for n in workers] == ["w1", "w2"], in_scratch
    assert {"objects", "input"} <= in_workers, in_workers  # object cache, the run's input
    # The executors' servers and targets, and afl-showmap (in a probe's directory): TMPDIR
    # in their worker's directory.
    assert {str(scratch / w) for w in workers} <= tmpdirs, tmpdirs
    assert all(Path(t).relative_to(scratch).parts[0] in workers for t in tmpdirs), tmpdirs
    assert os.listdir(scratch) == [], "a worker left its scratch behind"
    assert not stray_in_out, f"written into OUT beside its layout: {stray_in_out}"
    assert not stray_in_cwd, f"written into the directory it started from: {stray_in_cwd}"
    assert set(os.listdir(out)) <= LAYOUT
    assert "scratch" not in json.loads((out / MARKER).read_text())["config"]

    # Not part of the campaign's identity: a resume may put it elsewhere.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = explore(out, *args, "--resume", "--scratch", elsewhere)
    assert_oracles(out, resumed)
    assert os.listdir(elsewhere) == []


def _one_line(process: subprocess.CompletedProcess) -> str:
    """Our one error line (mpiexec may add lines of its own, e.g. a PMIx race at exit)."""
    text = process.stdout + process.stderr
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("symcc-mpi: error: ")]
    assert len(lines) == 1, text
    return lines[0]


def test_a_missing_scratch_is_one_line_before_mpiexec(build, tmp_path):
    process = subprocess.run(
        [str(Path(sys.executable).with_name("symcc-mpi")), "explore", "--target",
         f"{build / 'tlv'} @@", "--seeds", str(build.parent / "seeds" / "tlv"), "--out",
         str(tmp_path / "out"), "--scratch", "/nonexistent"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert process.returncode == 2
    assert (process.stdout + process.stderr).strip() == (
        "symcc-mpi: error: --scratch /nonexistent: cannot make a scratch directory there: "
        "no such directory")
    assert not (tmp_path / "out").exists()


def _mpiexec(*ranks: list[str]) -> list[str]:
    """One mpiexec, a command line per rank (MPMD: `-n 1 A : -n 1 B`)."""
    command = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "--oversubscribe"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    for i, rank in enumerate(ranks):
        command += [":"] * (i > 0) + ["-n", "1", sys.executable, "-m", "symcc_mpi", *rank]
    return command


def _rank_args(build: Path, out: Path, scratch: Path) -> list[str]:
    return ["explore", "--target", f"{build / 'tlv'} @@", "--seeds",
            str(build.parent / "seeds" / "tlv"), "--out", str(out), "--executor", "noop",
            "--fault-tolerance", "off", "--scratch", str(scratch)]


def test_under_the_users_mpiexec_the_master_refuses_a_scratch_it_cannot_use(build, tmp_path):
    out = tmp_path / "out"
    args = _rank_args(build, out, Path("/nonexistent"))
    process = subprocess.run(_mpiexec(args, args), capture_output=True, text=True,
                             timeout=300, cwd=ROOT)
    assert process.returncode != 0
    assert _one_line(process) == ("symcc-mpi: error: --scratch /nonexistent: cannot make a "
                                  "scratch directory there: no such directory")
    assert not out.exists()


def test_a_worker_whose_node_lacks_the_scratch_says_so_to_the_master(build, tmp_path):
    """DIR is node-local: here rank 0's exists and rank 1's does not (MPMD), as on a cluster
    whose nodes differ. The worker tells the master in a Fatal; with no worker left, the
    master ends the campaign."""
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    process = subprocess.run(
        _mpiexec(_rank_args(build, out, scratch), _rank_args(build, out, tmp_path / "gone")),
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    text = process.stdout + process.stderr
    assert "Traceback" not in text, text
    [line] = [line for line in text.splitlines() if "cannot work" in line]
    assert "rank 1 on " in line and line.endswith(
        f"cannot work: --scratch {tmp_path / 'gone'}: cannot make a scratch directory there: "
        "no such directory"), line
    assert "no usable worker" in stats(out)["extra"]["stop_reason"]
    assert stats(out)["executions"] == 0
    assert os.listdir(scratch) == []
