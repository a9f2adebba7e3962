"""A one-node Slurm of its own (munged, slurmctld, slurmd) in a directory, for the tests:
Debian's slurm-wlm and munge, configured on free ports with a munge key and socket of its
own, so it touches nothing of the machine's and is torn down whole."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "srun", "scancel",
            "scontrol", "sinfo", "squeue")
CPUS = 4  # slots the node offers (config_overrides: more than the machine's cores)
KILL_WAIT = 30  # seconds between a cancelled job's SIGTERM and its SIGKILL (preemption's grace)
START_SECONDS = 60


class Unavailable(Exception):
    """This machine cannot run the cluster: the one line to skip with."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.node = socket.gethostname()
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pid_files = [root / "slurmd.pid", root / "slurmctld.pid", root / "munge" / "pid"]

    def start(self) -> None:
        missing = [p for p in PROGRAMS if shutil.which(p) is None]
        if missing:
            raise Unavailable(f"Slurm is not installed here (no {', '.join(missing)}; "
                              "`make test` installs slurm-wlm and munge)")
        munge = self.root / "munge"
        for directory in (munge, self.root / "state", self.root / "spool", self.root / "log"):
            directory.mkdir(parents=True)
        (munge / "key").write_bytes(os.urandom(1024))
        (munge / "key").chmod(0o600)
        self._daemon(["munged", f"--key-file={munge / 'key'}", f"--socket={munge / 'socket'}",
                      f"--pid-file={munge / 'pid'}", f"--log-file={munge / 'log'}",
                      f"--seed-file={munge / 'seed'}", "--force"])
        self.conf.write_text(self._configuration(munge / "socket"))
        self._daemon(["slurmctld", "-f", str(self.conf)])
        self._daemon(["slurmd", "-f", str(self.conf)])
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise Unavailable(f"the test's Slurm did not come up in {START_SECONDS} s: "
                          f"{self._last_error()}")

    def _configuration(self, munge_socket: Path) -> str:
        root = self.root
        return f"""\
ClusterName=symccmpitest
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait={KILL_WAIT}
MinJobAge=3600
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

    def _daemon(self, command: list[str]) -> None:
        started = subprocess.run(command, env=self.env, capture_output=True, text=True,
                                 timeout=60)
        if started.returncode != 0:
            raise Unavailable(f"{command[0]} did not start: "
                              f"{(started.stderr or started.stdout).strip()[:300]}")

    def _last_error(self) -> str:
        for log in sorted((self.root / "log").glob("*.log")):
            errors = [line for line in log.read_text(errors="replace").splitlines()
                      if "error" in line]
            if errors:
                return f"{log.name}: {errors[-1][:300]}"
        return "no error logged"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--user=root", check=False)
        for pid_file in self.pid_files:
            with contextlib.suppress(OSError, ValueError):
                _end(int(pid_file.read_text().split()[0]))

    # -- using it ------------------------------------------------------------------------

    def run(self, *command: str, check: bool = True, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(list(command), env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: exit {done.returncode}\n"
                                 f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return done

    def sbatch(self, script: Path, cwd: Path) -> str:
        return self.run("sbatch", "--parsable", str(script), cwd=cwd).stdout.strip()

    def job(self, job_id: str) -> dict[str, str]:
        shown = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's record once it has ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.job(job_id)
            if record["JobState"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING",
                                          "SUSPENDED", "REQUEUED"):
                return record
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {self.job(job_id)['JobState']} after "
                             f"{timeout:.0f} s")

    def pmix_missing(self) -> str | None:
        """Why `srun --mpi=pmix` cannot start ranks here, or None if it can."""
        listed = self.run("srun", "--mpi=list", check=False)
        if "pmix" not in listed.stdout + listed.stderr:
            return "this Slurm has no mpi/pmix plugin (`srun --mpi=list`)"
        probe = self.run("srun", "-n", "1", "--mpi=pmix", "true", check=False, timeout=120)
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
            return f"srun --mpi=pmix cannot start a task: {last[:200]} (Debian: libpmix-dev)"
        return None


def _end(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie left for a parent that does not reap (a container's init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
