"""--scratch: each rank's node-local directory, made and checked where the rank runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from symcc_mpi.config import CampaignConfig, UsageError
from symcc_mpi.processes.scratch import (
    check_scratch,
    default_root,
    make_scratch,
    remove_scratch,
)
from symcc_mpi.roles.worker import Worker


def test_a_scratch_directory_is_private_and_under_the_root(tmp_path):
    made = make_scratch(tmp_path, "w1-")
    assert made.parent == tmp_path and made.name.startswith("symcc-mpi-w1-")
    assert made.stat().st_mode & 0o777 == 0o700
    assert make_scratch(tmp_path, "w1-") != made  # two ranks on one node
    check_scratch(tmp_path)  # leaves nothing behind
    assert len(os.listdir(tmp_path)) == 2


# Makes a scratch directory, starts a process that outlives it (an executor's), says both.
MAKER = """
import subprocess, sys, time
from symcc_mpi.processes.scratch import make_scratch
made = make_scratch(sys.argv[1], "w1-")
child = subprocess.Popen(["sleep", "600"])
print(made, child.pid, flush=True)
time.sleep(600)
"""


def test_the_scratch_of_a_killed_worker_is_removed_by_the_next_one_made_on_the_node(tmp_path):
    maker = subprocess.Popen([sys.executable, "-c", MAKER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    child = None
    try:
        name, pid = maker.stdout.readline().split()
        made, child = Path(name), int(pid)
        (made / "qsym.map").write_bytes(b"x" * 4096)
        older = tmp_path / "symcc-mpi-w1-ofanolderversion"  # no owner file: not judged
        older.mkdir()
        (tmp_path / "unrelated").mkdir()
        mine = make_scratch(tmp_path, "w2-")
        assert made.is_dir(), "the directory of a living worker was removed"
        maker.send_signal(signal.SIGKILL)
        maker.wait()
        # Its executor's process lives on, and holds no lock: the directory's owner is dead.
        os.kill(child, 0)
        again = make_scratch(tmp_path, "w1-")
        assert not made.exists()
        assert sorted(os.listdir(tmp_path)) == sorted(
            [mine.name, again.name, older.name, "unrelated"])
        remove_scratch(mine)
        remove_scratch(again)
        assert sorted(os.listdir(tmp_path)) == [older.name, "unrelated"]
    finally:
        maker.kill()
        if child is not None:
            os.kill(child, signal.SIGKILL)


def test_the_default_is_tmpdir_when_set_else_dev_shm(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert default_root() == tmp_path and make_scratch(None, "x-").parent == tmp_path
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    shm = Path("/dev/shm")
    assert default_root() == (shm if shm.is_dir() and os.access(shm, os.W_OK) else
                              Path(tempfile.gettempdir()))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "gone"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(UsageError, match=r"^--scratch .*/gone \(the default, this node's "
                                         r"temporary directory\): .*no such directory$"):
        check_scratch(None)


def _unwritable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
        return tmp_path / "ro"
    if not os.path.isdir("/sys"):
        pytest.skip("as root, only a kernel filesystem refuses a directory")
    return Path("/sys")


@pytest.mark.parametrize("case, why", [
    ("missing", "no such directory"),
    ("file", "not a directory"),
    ("unwritable", "not writable"),
    ("proc", "not writable"),
])
def test_a_root_that_cannot_hold_one_is_named_in_one_line(tmp_path, case, why):
    (tmp_path / "file").write_text("")
    root = {"missing": tmp_path / "missing" / "deeper", "file": tmp_path / "file",
            "proc": Path("/proc")}.get(case) or _unwritable(tmp_path)
    with pytest.raises(UsageError) as raised:
        check_scratch(root)
    message = str(raised.value)
    assert message.startswith(f"--scratch {root}: cannot make a scratch directory there: ")
    assert why in message and "\n" not in message


def _config(tmp_path: Path, scratch: Path | None) -> CampaignConfig:
    return CampaignConfig(target=("/bin/true", "@@"), seeds=None, out=tmp_path / "out",
                          executor="noop", scratch=scratch)


def test_a_worker_keeps_its_files_in_a_directory_of_its_own_under_the_root(tmp_path):
    worker = Worker(3, _config(tmp_path, tmp_path))
    assert worker.problem == ""
    assert worker.scratch.parent == tmp_path and worker.scratch.name.startswith("symcc-mpi-w3-")
    assert worker.objects.directory == worker.scratch / "objects"
    worker.close()
    assert not worker.scratch.exists()


def test_a_worker_that_cannot_make_its_scratch_says_why_instead_of_failing(tmp_path):
    """Its reason travels to the master in a Fatal ("rank N on HOST cannot work: ...")."""
    worker = Worker(1, _config(tmp_path, tmp_path / "missing"))
    assert worker.problem == (f"--scratch {tmp_path / 'missing'}: cannot make a scratch "
                              "directory there: no such directory")
    assert worker.scratch is None and worker.executor is None
    worker.close()


def test_the_scratch_is_not_the_campaigns_identity(tmp_path):
    """The marker OUT keeps (and a resume reads) holds no --scratch: a resume may move it."""
    assert "scratch" not in _config(tmp_path, tmp_path).to_json()
    assert _config(tmp_path, tmp_path).to_json() == _config(tmp_path, None).to_json()
