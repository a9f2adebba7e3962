"""The campaign's generation log: which communicator generation is current, who is in it,
and the plan and receipt of every recovery (F443 §2 "recovery state", §5's ordinal rule).

`OUT/state/generations.jsonl`, a checksummed journal (durable/journal.py's LineLog), written
by several processes: every survivor of a failure takes part in the recovery and writes or
confirms its records. A writer holds an exclusive flock on the file (durable/locks.py), cuts
a torn tail, re-reads it, decides, appends one record and fsyncs it before letting go;
readers (`verify`, `status`) read without the lock and never write.

Records, each with the next `ordinal` (0, 1, 2, ... with no gap):

    {"kind": "start",   "generation": g, "members": [...], ...}   a run's first generation
    {"kind": "prepare", "generation": g, "plan": {...}}           recovery of generation g
    {"kind": "commit",  "generation": g+1, "receipt": {...}}      generation g+1 begins
    {"kind": "end",     "generation": g, "status": ..., ...}      the master ended the job
                                                                  (MPI_Abort): no survivor
                                                                  recovers from it

The rules (F443 §5): a request whose record exists already - same kind, same generation - is
answered from that record when its digest is the same (an idempotent retry: a second survivor
confirming the first one's plan, or a writer that never learned its append succeeded) and
refused as a fork when it differs. A commit must name the digest of the prepared plan of the
generation before it, and advances the generation by exactly one.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from symcc_mpi.durable.journal import LineLog
from symcc_mpi.durable.lines import LineError, decode_line, write_all
from symcc_mpi.durable.locks import flocked

GENERATIONS_JOURNAL = "generations.jsonl"


class GenerationLogError(Exception):
    """The log cannot be trusted or refuses a request: recovery must stop (fail closed)."""


class ForkRefused(GenerationLogError):
    """A request contradicts a record already in the log (same ordinal key, other digest)."""


def digest_of(document: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


class RecordKind(str, enum.Enum):
    START = "start"  # a run's first generation
    PREPARE = "prepare"  # the durable plan of a recovery
    COMMIT = "commit"  # the next generation begins, with the recovery's receipt
    END = "end"  # the master ended the job on purpose


BEGINNINGS = (RecordKind.START, RecordKind.COMMIT)


@dataclass(frozen=True)
class Record:
    ordinal: int
    kind: RecordKind
    generation: int
    body: dict[str, Any]  # "members" of a start, "plan" of a prepare, "receipt" of a commit
    digest: str


class GenerationLog:
    def __init__(self, path: Path, *, quarantine_dir: Path | None = None,
                 writer: Callable[[int, bytes], None] = write_all):
        self.path = Path(path)
        self.quarantine_dir = quarantine_dir or self.path.parent / "quarantine"
        self.writer = writer

    # -- reading -------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """Every record, checked: ordinals contiguous, each line whole and checksummed. A torn
        last line (a writer killed inside its append) is not a record."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records = []
        lines = raw.split(b"\n")
        for number, line in enumerate(lines[:-1], start=1):  # the part after the last \n is
            try:                                             # empty, or a torn append
                record = _record(decode_line(line))
            except (LineError, ValueError, KeyError, TypeError) as error:
                raise GenerationLogError(f"{self.path}, line {number}: {error}") from None
            if record.ordinal != len(records):
                raise GenerationLogError(f"{self.path}, line {number}: ordinal "
                                         f"{record.ordinal} where {len(records)} was due")
            records.append(record)
        return records

    def current(self) -> Record | None:
        """The record that began the current generation (a start or a commit)."""
        begun = [r for r in self.records() if r.kind in BEGINNINGS]
        return begun[-1] if begun else None

    def first_of_run(self, generation: int) -> Record | None:
        """The start record of the run that `generation` belongs to."""
        starts = [r for r in self.records()
                  if r.kind is RecordKind.START and r.generation <= generation]
        return starts[-1] if starts else None

    def find(self, kind: RecordKind, generation: int) -> Record | None:
        return next((r for r in self.records() if r.kind == kind and r.generation == generation),
                    None)

    # -- writing -------------------------------------------------------------------------

    def start(self, members: list[str], extra: dict[str, Any]) -> Record:
        """A run's first generation: one past the last one this campaign had."""
        with self._locked() as (records, log):
            last = max((r.generation for r in records), default=-1)
            body = {"members": members, **extra}
            return self._append(log, records, RecordKind.START, last + 1, body)

    def end(self, generation: int, status: int, reason: str) -> Record:
        """The master ends the job on purpose (MPI_Abort): survivors must not take over."""
        with self._locked() as (records, log):
            return self._append(log, records, RecordKind.END, generation,
                                {"status": status, "reason": reason})

    def ended(self, generation: int) -> Record | None:
        """The end record of `generation`, if its master ended the job on purpose."""
        return self.find(RecordKind.END, generation)

    def prepare(self, plan: dict[str, Any]) -> Record:
        generation = plan["generation"]
        with self._locked() as (records, log):
            existing = _find(records, RecordKind.PREPARE, generation)
            if existing is not None:
                return _confirmed(log, existing, plan)
            current = _current(records)
            if current != generation:
                raise GenerationLogError(f"{self.path}: a recovery of generation {generation} "
                                         f"was asked, the current one is "
                                         f"{'none' if current is None else current}")
            return self._append(log, records, RecordKind.PREPARE, generation, plan)

    def commit(self, receipt: dict[str, Any]) -> Record:
        generation = receipt["generation"]
        with self._locked() as (records, log):
            existing = _find(records, RecordKind.COMMIT, generation)
            if existing is not None:
                return _confirmed(log, existing, receipt)
            prepared = _find(records, RecordKind.PREPARE, generation - 1)
            if prepared is None or prepared.digest != receipt.get("plan"):
                raise ForkRefused(f"{self.path}: the receipt of generation {generation} names "
                                  "no plan prepared for the generation before it")
            if _current(records) != generation - 1:
                # A later run began meanwhile (its start took this number): too late.
                raise ForkRefused(f"{self.path}: the receipt of generation {generation} comes "
                                  f"after generation {_current(records)} began")
            return self._append(log, records, RecordKind.COMMIT, generation, receipt)

    @contextmanager
    def _locked(self) -> Iterator[tuple[list[Record], LineLog]]:
        with flocked(self.path):
            # No cut-back: a writer that raised may have landed its record, which a retry
            # is then answered from (F443 §5: a lost acknowledgement).
            log = LineLog(self.path, quarantine_dir=self.quarantine_dir, writer=self.writer,
                          cut_back=False)
            try:
                # We hold the lock: a torn tail is no append in progress but a writer's death.
                log.cut_torn_tail()
                records = self.records()
                log.open_for_append()
                yield records, log
            finally:
                log.close()

    def _append(self, log: LineLog, records: list[Record], kind: RecordKind, generation: int,
                body: dict[str, Any]) -> Record:
        record = Record(len(records), kind, generation, body, digest_of(body))
        log.append({"ordinal": record.ordinal, "kind": kind.value, "generation": generation,
                    "body": body, "digest": record.digest})
        return record


def _record(raw: dict[str, Any]) -> Record:
    try:
        kind = RecordKind(raw["kind"])
    except ValueError:
        raise ValueError(f"unknown record kind {raw['kind']!r}") from None
    record = Record(int(raw["ordinal"]), kind, int(raw["generation"]), dict(raw["body"]),
                    str(raw["digest"]))
    if digest_of(record.body) != record.digest:
        raise ValueError("the record's digest is not that of its body")
    return record


def _find(records: list[Record], kind: RecordKind, generation: int) -> Record | None:
    return next((r for r in records if r.kind == kind and r.generation == generation), None)


def _current(records: list[Record]) -> int | None:
    begun = [r for r in records if r.kind in BEGINNINGS]
    return begun[-1].generation if begun else None


def _confirmed(log: LineLog, existing: Record, body: dict[str, Any]) -> Record:
    """The answer to a retry, or to a second survivor: the record when `body` is its body,
    once the record is durable (its writer may have died, or raised, between its write and
    its fsync); a fork otherwise."""
    if existing.digest != digest_of(body):
        raise ForkRefused(f"{existing.kind.value} of generation {existing.generation} is already "
                          f"recorded (ordinal {existing.ordinal}) with another digest")
    log.sync()
    return existing
