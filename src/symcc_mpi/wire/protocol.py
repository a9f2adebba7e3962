"""Message tags and typed envelopes between master and workers, strictly decoded.

Every message is a msgspec Struct packed with msgpack and sent as raw bytes: nothing a
worker sends is ever unpickled. Each tag carries exactly one envelope type; bytes that do
not decode into it (wrong type, missing or unknown field, bad token) raise
`MalformedMessage`, which the master counts and never acts upon beyond that.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import msgspec

from symcc_mpi.coverage.edges import Status as ProbeStatus
from symcc_mpi.executors.base import Outcome
from symcc_mpi.wire.control import ControlMessage, Token

# Seconds a rank waits at the end for the other side of STOP (its STOP_ACK, its last
# RESULTs) before it gives up on it.
SHUTDOWN_GRACE = 10.0

class Tag(enum.IntEnum):
    READY = 1
    WORK = 2
    RESULT = 3
    STOP = 4
    STOP_ACK = 5
    FATAL = 6  # a rank cannot go on (executor unusable, ...); the reason travels as data
    CONFIG = 7  # rank 0's verdict on the configuration, sent before any work
    RELEASE = 8  # the campaign is closed (everything durable): a worker may exit
    # Between masters (--masters, federation.py), on their own communicator:
    FINDING = 9  # an input kept, or a crash or hang, for the first master to name (AFL face)
    FIGURES = 10  # a master's figures, for the first master's reports
    QUIESCENCE = 11  # the two-phase end of the campaign (quiescence.py)
    SUCCESSOR = 12  # a worker took a dead master's place, to the first master
    FAREWELL = 13  # a master is done with the job's lease table, to the first master
    # A piece of a dispatch's pack of children, from a worker that does not see OUT, before
    # its RESULT (campaign/uploads.py)
    PACK = 14


class ResultOutcome(str, enum.Enum):
    """What a RESULT says of its input: a closed set on the wire (a value outside it does not
    decode). Every executors.base.Outcome, plus four for an input that was not analysed."""

    OK = Outcome.OK.value
    CRASH = Outcome.CRASH.value
    TIMEOUT = Outcome.TIMEOUT.value
    OOM = Outcome.OOM.value
    ERROR = Outcome.ERROR.value
    INVALID_INPUT = "invalid-input"  # the worker could not read the bytes it was sent, intact
    WORKER_ERROR = "worker-error"  # the worker failed around the executor (disk, triage, ...)
    # The worker could not write into OUT (full, over quota, read-only): not the input's
    # fault; the master stops the campaign instead of requeueing or deferring (storage.py).
    STORAGE_REFUSED = "storage-refused"
    # SIGTERM reached the job while the input ran (a scheduler cancelling or preempting it
    # signals every process, the target's too): the run was cut short, not the input's fault.
    INTERRUPTED = "interrupted"


INVALID_INPUT = ResultOutcome.INVALID_INPUT
WORKER_ERROR = ResultOutcome.WORKER_ERROR
STORAGE_REFUSED = ResultOutcome.STORAGE_REFUSED
INTERRUPTED = ResultOutcome.INTERRUPTED
NOT_ANALYSED = (INVALID_INPUT, WORKER_ERROR, STORAGE_REFUSED, INTERRUPTED)

TOKEN_PATTERN = re.compile(r"^[0-9a-f]{8,64}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# Bounds on what one RESULT may announce: far above any real run (SymCC numbers its outputs
# with six digits; generated inputs are about the size of their parent), far below what would
# cost the master memory or time to believe.
MAX_GENERATED = 1 << 20  # files one run may leave, and staged entries one RESULT may list
MAX_STAGED_SIZE = 1 << 30  # bytes of one staged file
MAX_TARGETS = 1 << 20  # branch targets one message may name (executors/base.py)
# A pack that travels over MPI (PackChunk): in pieces of at most PACK_CHUNK bytes, at most
# MAX_PACK in all.
PACK_CHUNK = 1 << 20
UPLOAD_WINDOW = 4  # pieces a worker has in flight at most
MAX_PACK = 1 << 32


class ResultField(str, enum.Enum):
    """The field of a RESULT that made it invalid: one counter each in stats.json, and the
    kinds of the `hostile` fault (faults.py)."""

    UNDECODABLE = "undecodable"  # not a RESULT at all
    OUTCOME = "outcome"
    STATUS = "status"  # a staged file's coverage probe verdict
    COVERAGE = "coverage"  # a staged file's coverage summary
    MANIFEST_LENGTH = "manifest-length"  # staged entries vs. `generated`, and their bounds
    SIZE = "size"
    NAME = "name"
    DUPLICATE = "duplicate"  # one staged file listed twice
    MISSING_FILE = "missing-file"  # listed, not in the staging directory
    NOT_REGULAR = "not-regular"  # listed, but a link, FIFO, device or directory
    STAGED_BYTES = "staged-bytes"  # a staged file whose bytes are not those announced
    FIGURES = "figures"  # exit status, times, solver counts
    DIGEST = "digest"  # it says it analysed other bytes than it was sent
    PRUNING = "pruning"  # its QSYM map bits
    GENERATION = "generation"  # not the generation of the WORK it answers (ulfm/)
    TARGETS = "targets"  # its branch targets (executors/base.py)
    PACK = "pack"  # its pack's pieces over MPI: out of order, too large, or incomplete


class Ready(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A worker asks for work; `token` is that of the dispatch it finished last."""

    token: str | None = None
    rings: bool = False  # this worker rings the master's doorbell after each send


class Work(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    token: str  # per-dispatch, echoed in RESULT and the following READY (F315)
    digest: str  # SHA-256 of the input's bytes: the work identity
    # Content-addressed objects (SHA-256 → bytes) the worker is not known to hold yet; the
    # input itself is one (F313 §3.5).
    objects: dict[str, bytes] = msgspec.field(default_factory=dict)
    pruning: bytes = b""  # pruning.Delta of the QSYM map bits the worker was not sent yet
    generation: int = 0  # of the communicator it was sent on (ulfm/), echoed in RESULT
    # The branches to solve (executors/base.py): None, every one; [], none (a trace).
    targets: list[int] | None = None
    # The campaign's epoch (tiers/schedule.py): a worker that sees a new one starts its
    # QSYM map afresh, before it takes in the `pruning` bits.
    epoch: int = 0
    pruned: bool = True  # False: every branch solved, QSYM's map and linearization off


class StagedFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One generated input in the worker's staging directory, named by its SHA-256."""

    digest: str
    size: int
    coverage: bytes | None = None  # packed edge summary (edges.FileCoverage), if probed
    status: ProbeStatus = ProbeStatus.OK  # coverage probe verdict (closed set on the wire)


class TaskPhases(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """Where one task's worker time went, in seconds: the target process apart from its
    solving, the solver, copying children into staging, the coverage probe, everything else
    of the task; `messages` (sending READY and RESULT) and `wait` (READY to WORK, idle) are
    those of the task before, as they end after its RESULT left."""

    target: float = 0.0
    solver: float = 0.0
    staging: float = 0.0
    probe: float = 0.0
    other: float = 0.0
    messages: float = 0.0
    wait: float = 0.0


PHASES = tuple(TaskPhases.__struct_fields__)


class Result(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    token: str
    digest: str  # SHA-256 the worker computed over the bytes it actually ran
    outcome: ResultOutcome
    exit_status: int | None
    wall_time: float
    solver_time: float
    staged: list[StagedFile]
    generated: int  # files the executor left, before de-duplication within this run
    message: str = ""
    pruning: bytes = b""  # pruning.Delta: what this run added to the worker's QSYM map
    solver_queries: int = 0  # solver checks QSYM made
    queries_skipped: int | None = None  # symbolic branches it did not solve; None: unknown
    generation: int = 0  # the WORK's, echoed: a RESULT of another generation is stale
    # The branch targets on the input's path, in a RESULT of a trace or a target group (None:
    # not known); a whole input's path is not sent.
    path_targets: list[int] | None = None
    solved_targets: list[int] = []  # those whose negation this run handed to the solver
    phases: TaskPhases = TaskPhases()


class Stop(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    reason: str = ""
    failure: bool = False  # between masters: the campaign stops because a rank died


class StopAck(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    executions: int
    executor_time: float


class Release(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """After STOP_ACK a worker stays until this: if the master dies before it closed the
    campaign, the workers still there recover and one of them finishes the close (ulfm/)."""


class Fatal(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    host: str
    reason: str


class ConfigVerdict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    ok: bool
    error: str = ""
    doorbell: str = ""  # the master's doorbell address (doorbell.py), for workers on its host
    generation: int = 0  # the communicator generation this CONFIG opens (ulfm/)
    # With several masters, the index of the master the group serves: one whose group took
    # the first master's place serves master 0 (federation/succession.py).
    master: int = 0
    # A file the master made in OUT/.staging/: a worker that sees it stages its packs there,
    # one that does not sends them over MPI (PackChunk).
    staging_marker: str = ""


class PackChunk(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`data`: the bytes of dispatch `token`'s pack (wire/staging.py) from byte `offset`;
    `last`: the pack ends with them."""

    token: str
    offset: int
    data: bytes
    last: bool


class FindingKind(str, enum.Enum):
    """Where a finding goes in the AFL face: queue/, crashes/ or hangs/."""

    QUEUE = "queue"
    CRASHES = "crashes"
    HANGS = "hangs"


class Finding(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A master other than the first kept an input (`queue`, corpus/<sha256> is published)
    or found a crash or hang: the first master gives it its AFL name, because AFL's sync
    skips for ever an id that appears after a higher one (federation.py)."""

    kind: FindingKind
    digest: str
    parent: str = ""  # the input it was generated from; "" for none
    signal: int | None = None  # of a crash
    data: bytes = b""  # a crash's or hang's bytes when corpus/ does not hold them


class Figures(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A master's latest figures (report.CampaignSnapshot fields), for the first master."""

    master: int
    snapshot: dict[str, Any]
    final: bool = False


class Death(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A master's death its group went through: `failed` names it, `detected` (Unix time)
    and `seconds` say when the group noticed and how long it took to shrink, `requeued`
    counts the leases its successor took over (None: that successor died before it said)."""

    failed: str
    detected: float
    seconds: float
    requeued: int | None = None


class Successor(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The sender, a worker of dead master `master`'s group, is that master now. `deaths`:
    every death of its group's master it went through, oldest first (a successor that died
    in turn may not have told the first master of the one before), which the first master
    keeps in its figures whatever becomes of the sender."""

    master: int
    deaths: list[Death] = []
    # The first master's successor, to the others: the token of the end the dead one had
    # decided (its COMMIT, made durable before it went out), or None (any PREPARE is void).
    decided: Token | None = None


class Farewell(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The sender closed its part of the campaign: it touches the lease table no more."""


ENVELOPES: dict[Tag, type[msgspec.Struct]] = {
    Tag.READY: Ready,
    Tag.WORK: Work,
    Tag.RESULT: Result,
    Tag.STOP: Stop,
    Tag.STOP_ACK: StopAck,
    Tag.FATAL: Fatal,
    Tag.CONFIG: ConfigVerdict,
    Tag.RELEASE: Release,
    Tag.FINDING: Finding,
    Tag.FIGURES: Figures,
    Tag.QUIESCENCE: ControlMessage,  # a union: each message carries its kind
    Tag.SUCCESSOR: Successor,
    Tag.FAREWELL: Farewell,
    Tag.PACK: PackChunk,
}

_ENCODER = msgspec.msgpack.Encoder()
_DECODERS = {tag: msgspec.msgpack.Decoder(kind) for tag, kind in ENVELOPES.items()}


class MalformedMessage(ValueError):
    """Bytes that are not a valid envelope for their tag; `field`: the RESULT field at fault,
    when the envelope is a RESULT."""

    def __init__(self, reason: str, field: ResultField | None = None):
        super().__init__(reason)
        self.field = field


# msgspec names the path of the value it refused ("... - at `$.staged[0].status`").
_ERROR_PATH = re.compile(r"at `\$\.(\w+)(?:\[\d+\]\.(\w+))?`")
_FIELD_OF_PATH = {
    "outcome": ResultField.OUTCOME, "staged.status": ResultField.STATUS,
    "staged.coverage": ResultField.COVERAGE, "staged.digest": ResultField.NAME,
    "staged.size": ResultField.SIZE, "generated": ResultField.MANIFEST_LENGTH,
    "digest": ResultField.DIGEST, "pruning": ResultField.PRUNING,
    "phases": ResultField.FIGURES,
    "path_targets": ResultField.TARGETS, "solved_targets": ResultField.TARGETS,
    **dict.fromkeys(("exit_status", "wall_time", "solver_time", "solver_queries",
                     "queries_skipped"), ResultField.FIGURES),
}


def encode(message: msgspec.Struct) -> bytes:
    return _ENCODER.encode(message)


def decode(tag: int, payload: bytes) -> msgspec.Struct:
    try:
        kind = Tag(tag)
    except ValueError:
        raise MalformedMessage(f"unknown tag {tag}") from None
    try:
        message = _DECODERS[kind].decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        field = None
        if kind is Tag.RESULT:
            path = _ERROR_PATH.search(str(error))
            name = ".".join(filter(None, path.groups())) if path else ""
            field = _FIELD_OF_PATH.get(name, ResultField.UNDECODABLE)
        raise MalformedMessage(f"{kind.name}: {error}", field) from None
    _check_fields(message)
    return message


def staged_entry_problem(entry: StagedFile) -> tuple[ResultField, str] | None:
    """What is wrong with one staged entry's name or size, if anything."""
    if not isinstance(entry.digest, str) or not SHA256_PATTERN.match(entry.digest):
        return ResultField.NAME, f"staged name {entry.digest!r:.80} is not a lowercase SHA-256"
    if not 0 <= entry.size <= MAX_STAGED_SIZE:
        return ResultField.SIZE, f"staged {entry.digest[:12]}: size {entry.size} out of range"
    return None


def _check_fields(message: msgspec.Struct) -> None:
    token = getattr(message, "token", None)
    if token is not None and not TOKEN_PATTERN.match(token):
        raise MalformedMessage(f"bad token {token!r}", ResultField.UNDECODABLE
                               if isinstance(message, Result) else None)
    digest = getattr(message, "digest", None)
    if digest is not None and not SHA256_PATTERN.match(digest):
        raise MalformedMessage(f"bad digest {digest!r}", ResultField.DIGEST
                               if isinstance(message, Result) else None)
    parent = getattr(message, "parent", "")
    if parent and not SHA256_PATTERN.match(parent):
        raise MalformedMessage(f"bad parent hash {parent!r:.80}")
    for digest in getattr(message, "objects", ()):
        if not SHA256_PATTERN.match(digest):
            raise MalformedMessage(f"bad object id {digest!r}")
    for staged in getattr(message, "staged", ()):
        if problem := staged_entry_problem(staged):
            raise MalformedMessage(f"bad staged entry: {problem[1]}", problem[0])
    for name in ("targets", "path_targets", "solved_targets"):
        if problem := _targets_problem(getattr(message, name, None)):
            raise MalformedMessage(f"bad {name}: {problem}", ResultField.TARGETS
                                   if isinstance(message, Result) else None)


def _targets_problem(targets: list[int] | None) -> str:
    if not targets:
        return ""
    if len(targets) > MAX_TARGETS:
        return f"{len(targets)} targets, more than {MAX_TARGETS}"
    if min(targets) <= 0:
        return f"target {min(targets)} is not positive"
    if len(set(targets)) != len(targets):
        return "a target listed twice"
    return ""
