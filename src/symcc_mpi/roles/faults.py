"""Fault injection by configuration, for the real-mpiexec tests.

`SYMCC_MPI_FAULTS` is a comma-separated list of `RANK:KIND@N` (or `RANK:KIND@N=SECONDS` for
`pause`, `RANK:hostile@N=FIELD` for `hostile`). KIND is a `FaultKind`: one vocabulary for these
faults of real ranks and those the simulation (tests/simulation) injects. N counts dispatches
as the faulty side sees them, from 1. Worker kinds:

- `foreign-result`: before the real RESULT of its N-th dispatch, send a RESULT with a token
  it was never given, carrying a real staged file;
- `stale-result`: before the real RESULT of its N-th dispatch, send one with the token of its
  previous dispatch (already answered), carrying a new staged file;
- `malformed-result`: send garbage instead of the RESULT of its N-th dispatch (its next READY
  then echoes the token);
- `pause`: after running its N-th dispatch, stop itself (SIGSTOP) until SECONDS (default 5)
  after that dispatch's WORK arrived, then send its RESULT as if nothing happened. The hold
  is counted from the arrival, not from the end of the execution, so a test knows when the
  RESULT comes however slowly the execution ran (a busy machine); if the execution alone
  took longer, there is no stop. A worker killed while stopped leaves no helper behind.
  `pause@N=release`: instead, say so in OUT/.fault-held-RANK and wait (not stopped, for at
  most an hour) until OUT/.fault-release exists, or OUT/.fault-release-RANK for this rank
  alone (which it then removes): a test then looks at a campaign that cannot move on until
  it says so;
- `hostile`: instead of the RESULT of its N-th dispatch, send one whose FIELD is made hostile,
  around a file it plants in its staging directory (the bytes start with HOSTILE_MARK and
  must never reach the corpus). FIELD is a `protocol.ResultField` value: `outcome`, `status`
  (values outside the wire's closed sets: raw msgpack, the Struct would not encode them),
  `coverage` (a summary past the campaign's map), `manifest-length` (more entries than
  `generated`), `size` (negative), `name` (upper-case hex), `duplicate` (one file listed
  twice), `missing-file`, `not-regular` (a FIFO), `staged-bytes` (bytes not those named),
  `figures` (a negative wall time), `digest` (other bytes than sent), `pruning` (garbage
  map bits), `generation` (the next one), `targets` (branch targets that are not positive).

Any rank, under ULFM (ulfm/); RANK is the rank in MPI_COMM_WORLD, and a worker that takes
over as master fires the master's points:

- `die@N`: SIGKILL itself; a worker during its N-th execution, the master right after its
  N-th WORK send;
- `die@N=after-recovery` (master): SIGKILL itself right after its N-th WORK send since the
  first recovery it went through, kept or taking over (a second failure that must come
  after the first, however fast each rank runs);
- `die@N=recovery`: SIGKILL itself inside its N-th recovery, after the durable prepare and
  before the shrink (a failure during the recovery itself); with several masters, a worker
  taking a dead master's place, inside its takeover of the N-th dead master of its group,
  once the leases are adopted;
- `die@N=after-manifest`, `die@N=after-publish` (master): SIGKILL itself inside its N-th
  commit, after the manifest is written and before anything is published, or after the
  publication and before the done record;
- `die@1=closing` (master): SIGKILL itself when it closes the campaign, after every worker
  acknowledged STOP and before the last group commit and the RELEASE;
- `die@1=withdrawn` (master, --masters): SIGKILL itself two seconds after it withdrew from
  the work, left with no worker (federation/withdrawal.py): its withdrawal on record, and
  its figures, which say why, with the first master.

Master kinds, counting WORK sends (rank 0, and with --masters the first rank of each group):

- `send-fail`: the N-th WORK send raises instead of sending;
- `send-ambiguous`: the N-th WORK send delivers, then raises (F313 §4: the master cannot
  tell, undoes the dispatch as unsent, and the worker's RESULT must then be refused);
- `object-send-fail`: the N-th WORK that carries object content raises instead of sending;
- `pause@N=SECONDS`: right after the N-th WORK send, stop itself (SIGSTOP) for SECONDS
  (default 5): a master paused past its leases' TTL (--masters, F320 §2.3). `pause@N=release`:
  held there as a worker is (no round, no heartbeat) until the test releases it.

With --masters, `mK:KIND@N` plans a master kind for master K, whatever its rank.

Master kinds (rank 0), counting the group commits of the done journal that carry records
(`CampaignDir.sync_done`); each `kill-*` SIGKILLs the master itself at its step of the N-th:

- `kill-before-children-sync`: before the files published since the last commit are fsynced;
- `kill-before-done-append`: after they (and their directories) are durable, before the done
  records are appended;
- `kill-after-done-fsync`: right after the journal's fsync;
- `torn-done-append`: write the N-th commit's records up to the middle of the last, then
  wait until OUT/.fault-release exists (for at most an hour) before writing the rest: the
  journal has a torn tail meanwhile, which readers must leave alone.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from symcc_mpi.config import fault_plan
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.lines import Writer, write_all
from symcc_mpi.wire.protocol import ResultField


class FaultKind(enum.Enum):
    """Every fault symcc-mpi is tested under, one name each."""

    # Planned in real ranks (SYMCC_MPI_FAULTS) and injected by the simulation alike.
    DIE = "die"  # SIGKILL of a rank
    PAUSE = "pause"  # SIGSTOP of a rank, for SECONDS
    SEND_FAIL = "send-fail"  # a WORK send raises instead of sending
    # Real ranks only: faults at a point of the protocol's code.
    FOREIGN_RESULT = "foreign-result"
    STALE_RESULT = "stale-result"
    MALFORMED_RESULT = "malformed-result"
    HOSTILE = "hostile"
    SEND_AMBIGUOUS = "send-ambiguous"
    OBJECT_SEND_FAIL = "object-send-fail"
    TORN_DONE_APPEND = "torn-done-append"
    KILL_BEFORE_CHILDREN_SYNC = "kill-before-children-sync"
    KILL_BEFORE_DONE_APPEND = "kill-before-done-append"
    KILL_AFTER_DONE_FSYNC = "kill-after-done-fsync"
    # The simulation only: faults of the machine it simulates (links, clocks, disks).
    SLOW_LINK = "slow-link"
    CLOCK_JUMP = "clock-jump"
    SUSPEND = "suspend"  # the whole machine stops for SECONDS
    STALE_GENERATION = "stale-generation"
    DISK_ERROR = "disk-error"
    DISK_FULL = "disk-full"
    TORN_WRITE = "torn-write"
    SLOW_DISK = "slow-disk"
    LEASE_WRITE_ERROR = "lease-write-error"
    SLOW_LEASE_WRITE = "slow-lease-write"
    STALL_IN_COMMIT = "stall-in-commit"
    MACHINE_CRASH = "machine-crash"  # a machine dies: its ranks, and what it had not synced


K = FaultKind
WORKER_KINDS = frozenset({K.FOREIGN_RESULT, K.STALE_RESULT, K.MALFORMED_RESULT, K.PAUSE,
                          K.HOSTILE, K.DIE})
DIE_POINTS = ("", "recovery", "after-recovery", "after-manifest", "after-publish", "closing",
              "withdrawn")
# What `malformed-result` already covers (garbage bytes) is not a hostile field.
HOSTILE_FIELDS = tuple(f.value for f in ResultField if f is not ResultField.UNDECODABLE)
HOSTILE_MARK = b"hostile result: must never reach the corpus "
COMMIT_KILL_STEPS = ("before-children-sync", "before-done-append", "after-done-fsync")
MASTER_KINDS = frozenset({K.SEND_FAIL, K.SEND_AMBIGUOUS, K.OBJECT_SEND_FAIL, K.TORN_DONE_APPEND,
                          K.DIE, K.PAUSE, K.KILL_BEFORE_CHILDREN_SYNC, K.KILL_BEFORE_DONE_APPEND,
                          K.KILL_AFTER_DONE_FSYNC})
DEFAULT_PAUSE_SECONDS = 5.0
RELEASE_FILE = ".fault-release"
HELD_FILE = ".fault-held-{}"  # + the world rank: it waits for RELEASE_FILE
RELEASE_WAIT = 3600.0

log = logging.getLogger("symcc_mpi.roles.faults")


class Faults:
    def __init__(self, rank: int, spec: str | None = None, *, master_index: int | None = None):
        """The plan for world rank `rank`, which is master `master_index` if a master."""
        spec = fault_plan() if spec is None else spec
        self.rank = rank
        self.planned: dict[tuple[FaultKind, int], str] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            target, _, rest = item.partition(":")
            name, _, when = rest.partition("@")
            number, _, argument = when.partition("=")
            master = target[1:] if target.startswith("m") else None
            kinds = MASTER_KINDS if target == "0" or master is not None else WORKER_KINDS
            kind = _KINDS.get(name)
            if kind not in kinds or not (master or target).isdigit() or not number.isdigit() \
                    or not _argument_fits(kind, argument):
                raise ValueError(f"SYMCC_MPI_FAULTS: cannot parse {item!r}")
            if (int(master) == master_index) if master is not None else int(target) == rank:
                self.planned[(kind, int(number))] = argument

    def fire(self, kind: FaultKind, number: int) -> bool:
        """Whether `kind` is planned at `number` (with no argument, for `die`)."""
        return self.planned.get((kind, number)) == "" if kind is FaultKind.DIE \
            else (kind, number) in self.planned

    def fire_at(self, kind: FaultKind, point: str, number: int) -> bool:
        """Whether `kind@number=point` is planned."""
        return self.planned.get((kind, number)) == point

    def paused_until_released(self, number: int) -> bool:
        return self.planned.get((FaultKind.PAUSE, number)) == "release"

    def pause_seconds(self, number: int) -> float:
        return float(self.planned.get((FaultKind.PAUSE, number)) or DEFAULT_PAUSE_SECONDS)

    def hostile_field(self, number: int) -> str | None:
        """The field to make hostile in the RESULT of dispatch `number`, if any."""
        return self.planned.get((FaultKind.HOSTILE, number))

    def commit_probe(self):
        """What `CampaignDir.commit_probe` calls, or None when no commit kill is planned."""
        if not any(kind.value.startswith("kill-") for kind, _ in self.planned):
            return None

        def probe(step: str, commit_number: int) -> None:
            if self.fire(FaultKind(f"kill-{step}"), commit_number):
                log.warning("fault: SIGKILL of the master %s of group commit %d", step,
                            commit_number)
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        return probe

    def done_writer(self, out: Path) -> Writer | None:
        """The done journal's write step, or None when no torn append is planned."""
        torn = [number for kind, number in self.planned if kind is FaultKind.TORN_DONE_APPEND]
        if not torn:
            return None
        writes = 0

        def write(fd: int, data: bytes) -> None:
            nonlocal writes
            writes += 1
            if writes not in torn:
                write_all(fd, data)
                return
            # Cut inside the last line: half of several records of equal length would be a
            # whole number of lines, not a torn one.
            last_line = data.rfind(b"\n", 0, len(data) - 1) + 1
            cut = last_line + max(1, (len(data) - last_line) // 2)
            write_all(fd, data[:cut])
            wait_for_release(out)
            write_all(fd, data[cut:])

        return write


def wait_for_release(out: Path, rank: int | None = None) -> None:
    """Until OUT/RELEASE_FILE exists (a test's say), or OUT/RELEASE_FILE-RANK for world rank
    `rank` alone (removed once seen), for at most RELEASE_WAIT."""
    deadline = SYSTEM_CLOCK.monotonic() + RELEASE_WAIT
    alone = out / f"{RELEASE_FILE}-{rank}" if rank is not None else None
    while not (out / RELEASE_FILE).exists() and SYSTEM_CLOCK.monotonic() < deadline:
        if alone is not None and alone.exists():
            alone.unlink()
            return
        SYSTEM_CLOCK.sleep(0.05)


def hold_until_released(out: Path, rank: int) -> None:
    """Say in OUT that world rank `rank` is held, wait for the release, then say it is not."""
    held = out / HELD_FILE.format(rank)
    held.touch()
    wait_for_release(out, rank)
    held.unlink(missing_ok=True)


def die(reason: str) -> None:
    """SIGKILL this process, as a crash would, after saying why in the log."""
    log.warning("%s", reason)
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


_KINDS = {kind.value: kind for kind in FaultKind}


def _argument_fits(kind: FaultKind, argument: str) -> bool:
    if kind is FaultKind.PAUSE:
        return not argument or argument == "release" or _is_seconds(argument)
    if kind is FaultKind.HOSTILE:
        return argument in HOSTILE_FIELDS
    if kind is FaultKind.DIE:  # any rank: a worker may become the master (ulfm/)
        return argument in DIE_POINTS
    return not argument


def _is_seconds(text: str) -> bool:
    try:
        return 0 < float(text) < 3600
    except ValueError:
        return False


# Runs in a process of its own: continues the stopped rank at `until` (the system-wide
# monotonic clock), once it is really stopped, and gives up if the rank is gone first, so
# that a rank killed while stopped leaves nothing behind.
_CONTINUE_AT = """
import os, signal, sys, time
pid, until = int(sys.argv[1]), float(sys.argv[2])
def state():
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
try:
    while (now := time.monotonic()) < until or state() != "T":
        if state() == "Z":
            sys.exit()
        time.sleep(min(0.5, max(0.01, until - now)))
    os.kill(pid, signal.SIGCONT)
except (ProcessLookupError, FileNotFoundError):
    pass
"""


def stop_self(until: float) -> None:
    """Hang, as a rank stuck in a syscall would, until `until` (SYSTEM_CLOCK.monotonic()): the
    hold ends at a time the test chose, however long the work before it took."""
    if until <= SYSTEM_CLOCK.monotonic():
        return
    subprocess.Popen([sys.executable, "-c", _CONTINUE_AT, str(os.getpid()), repr(until)],
                     start_new_session=True)
    os.kill(os.getpid(), signal.SIGSTOP)
