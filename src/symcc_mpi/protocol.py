"""Message tags and typed envelopes between master and workers, strictly decoded.

Every message is a msgspec Struct packed with msgpack and sent as raw bytes: nothing a
worker sends is ever unpickled. Each tag carries exactly one envelope type; bytes that do
not decode into it (wrong type, missing or unknown field, bad token) raise
`MalformedMessage`, which the master counts and never acts upon beyond that.
"""

from __future__ import annotations

import enum
import re

import msgspec


class Tag(enum.IntEnum):
    READY = 1
    WORK = 2
    RESULT = 3
    STOP = 4
    STOP_ACK = 5
    FATAL = 6  # a rank cannot go on (executor unusable, ...); the reason travels as data
    CONFIG = 7  # rank 0's verdict on the configuration, sent before any work


# Result outcomes besides executors.base.Outcome: the input was not analysed at all.
INVALID_INPUT = "invalid-input"  # the worker could not read the bytes it was sent, intact
WORKER_ERROR = "worker-error"  # the worker failed around the executor (disk, triage, ...)
# The worker could not write into OUT (full, over quota, read-only): not the input's fault;
# the master stops the campaign instead of requeueing or deferring (storage.py).
STORAGE_REFUSED = "storage-refused"
NOT_ANALYSED = (INVALID_INPUT, WORKER_ERROR, STORAGE_REFUSED)

TOKEN_PATTERN = re.compile(r"^[0-9a-f]{8,64}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")


class Ready(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A worker asks for work; `token` is that of the dispatch it finished last."""

    token: str | None = None
    rings: bool = False  # this worker rings the master's doorbell after each send


class Work(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    token: str  # per-dispatch, echoed in RESULT and the following READY (F315)
    input_hash: str  # SHA-256 of the input's bytes: the work identity
    # Content-addressed objects (SHA-256 → bytes) the worker is not known to hold yet; the
    # input itself is one (F313 §3.5).
    objects: dict[str, bytes] = msgspec.field(default_factory=dict)
    pruning: bytes = b""  # pruning.Delta of the QSYM map bits the worker was not sent yet


class StagedFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One generated input in the worker's staging directory, named by its SHA-256."""

    sha256: str
    size: int
    coverage: bytes | None = None  # packed edge summary (triage.FileCoverage), if probed
    status: str = "ok"  # coverage probe verdict: ok / crash / hang


class Result(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    token: str
    input_hash: str  # SHA-256 the worker computed over the bytes it actually ran
    outcome: str  # executors.base.Outcome value, or one of NOT_ANALYSED
    exit_status: int | None
    wall_time: float
    solver_time: float
    staged: list[StagedFile]
    generated: int  # files the executor left, before de-duplication within this run
    message: str = ""
    pruning: bytes = b""  # pruning.Delta: what this run added to the worker's QSYM map
    solver_queries: int = 0  # solver checks QSYM made
    queries_skipped: int | None = None  # symbolic branches it did not solve; None: unknown


class Stop(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    reason: str = ""


class StopAck(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    executions: int
    executor_time: float


class Fatal(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    host: str
    reason: str


class ConfigVerdict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    ok: bool
    error: str = ""
    doorbell: str = ""  # the master's doorbell address (doorbell.py), for workers on its host


ENVELOPES: dict[Tag, type[msgspec.Struct]] = {
    Tag.READY: Ready,
    Tag.WORK: Work,
    Tag.RESULT: Result,
    Tag.STOP: Stop,
    Tag.STOP_ACK: StopAck,
    Tag.FATAL: Fatal,
    Tag.CONFIG: ConfigVerdict,
}

_ENCODER = msgspec.msgpack.Encoder()
_DECODERS = {tag: msgspec.msgpack.Decoder(kind) for tag, kind in ENVELOPES.items()}


class MalformedMessage(ValueError):
    """Bytes that are not a valid envelope for their tag."""


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
        raise MalformedMessage(f"{kind.name}: {error}") from None
    _check_fields(message)
    return message


def _check_fields(message: msgspec.Struct) -> None:
    token = getattr(message, "token", None)
    if token is not None and not TOKEN_PATTERN.match(token):
        raise MalformedMessage(f"bad token {token!r}")
    digest = getattr(message, "input_hash", None)
    if digest is not None and not SHA256_PATTERN.match(digest):
        raise MalformedMessage(f"bad input hash {digest!r}")
    for object_id in getattr(message, "objects", ()):
        if not SHA256_PATTERN.match(object_id):
            raise MalformedMessage(f"bad object id {object_id!r}")
    for staged in getattr(message, "staged", ()):
        if not SHA256_PATTERN.match(staged.sha256) or staged.size < 0:
            raise MalformedMessage(f"bad staged entry {staged.sha256!r}")
