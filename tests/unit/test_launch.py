"""The launcher ends its job's whole session on every exit path, its own failures included."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

import symcc_mpi.job.launch as launch
import symcc_mpi.job.progress as progress
from symcc_mpi.config import CampaignConfig

# Stands in for mpiexec: a "rank" in a process group of its own (as prterun starts them),
# both ignoring SIGINT (the launcher's second step) and SIGTERM, so that only the launcher's
# SIGKILL of the session ends them.
JOB = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    process_group=0)
open(sys.argv[1], "w").write(str(rank.pid))
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@pytest.fixture
def job(tmp_path, monkeypatch):
    rank_file = tmp_path / "rank.pid"
    monkeypatch.setattr(launch, "mpiexec_command",
                        lambda config, argv: [sys.executable, "-c", JOB, str(rank_file)])
    monkeypatch.setattr(launch, "TERMINATE_GRACE", 0.5)
    config = CampaignConfig(target=("t",), seeds=tmp_path, out=tmp_path / "out")
    (tmp_path / "out").mkdir()
    return config, rank_file


def wait_for(path: Path) -> int:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the stand-in job never started"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_failure_of_the_launcher_itself_still_ends_the_whole_job(job, monkeypatch, capsys):
    config, rank_file = job

    class FailingView(progress.LiveView):
        def refresh(self):
            wait_for(rank_file)
            raise RuntimeError("the view broke")

    monkeypatch.setattr(progress, "LiveView", FailingView)
    assert launch.launch(config, [], live=False) == 1
    rank = int(rank_file.read_text())
    assert not alive(rank), "a rank outlived the launcher"
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["symcc-mpi: error: the launcher failed: RuntimeError: the view broke"]


def test_a_third_signal_kills_the_whole_session(job, monkeypatch):
    config, rank_file = job

    class SignallingView(progress.LiveView):
        def refresh(self):
            wait_for(rank_file)
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(progress, "LiveView", SignallingView)
    returncode = launch.launch(config, [], live=False)
    assert returncode == 128 + signal.SIGKILL
    assert not alive(int(rank_file.read_text()))
    assert (config.out / ".stop-request").read_text().strip()  # the first asked this run


def test_session_members_lists_only_live_processes_of_that_session():
    assert os.getpid() in launch.session_members(os.getsid(0))
    assert launch.session_members(2**22 + 1) == []  # above any pid


# Stands in for an mpiexec that exits 0, its master having written stats.json as given.
REPORTING_JOB = """
import json, os, sys
from symcc_mpi.config import RUN_ID_ENV
phase = sys.argv[2]
if phase != "none":
    extra = {"run_id": os.environ[RUN_ID_ENV], "phase": phase, "exit_status": 0}
    open(os.path.join(sys.argv[1], "stats.json"), "w").write(json.dumps({"extra": extra}))
"""


@pytest.mark.parametrize(("phase", "status"), [("done", 0), ("running", 1), ("none", 1)])
def test_mpiexec_success_counts_only_with_the_campaigns_final_report(tmp_path, monkeypatch,
                                                                     phase, status):
    """Under ULFM, mpiexec exited 0 although the first master had been SIGKILLed (CI): only
    the master's final report of this run makes a campaign a success."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(launch, "mpiexec_command", lambda config, argv: [
        sys.executable, "-c", REPORTING_JOB, str(out), phase])
    config = CampaignConfig(target=("t",), seeds=tmp_path, out=out)
    assert launch.launch(config, [], live=False) == status


# Fails the way prterun did in CI the first time it is started, then runs a clean campaign.
FLAKY_START_JOB = """
import json, os, sys
from symcc_mpi.config import RUN_ID_ENV
out = sys.argv[1]
marker = os.path.join(out, "started-once")
if not os.path.exists(marker):
    open(marker, "w").close()
    print("The PMIx server's listener thread failed to start. We cannot")
    sys.exit(1)
extra = {"run_id": os.environ[RUN_ID_ENV], "phase": "done", "exit_status": 0}
open(os.path.join(out, "stats.json"), "w").write(json.dumps({"extra": extra}))
"""


def test_a_pmix_server_that_did_not_start_is_started_again(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(launch, "mpiexec_command", lambda config, argv: [
        sys.executable, "-c", FLAKY_START_JOB, str(out)])
    config = CampaignConfig(target=("t",), seeds=tmp_path, out=out)
    assert launch.launch(config, [], live=False) == 0
    assert "starting the job again" in capsys.readouterr().out
