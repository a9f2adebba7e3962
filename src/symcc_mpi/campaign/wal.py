"""The done journal's records (F443's work WAL): their closed kinds, one schema, one reader.

`OUT/state/done.jsonl` (durable/journal.py's line format) holds, per master:

    done       the input is analysed and its results are published (the resume point);
               written WITHOUT a "kind" field, as every journal so far was: the format stays
               the one older versions wrote and read, and a done record costs no more bytes
    part       a part of a split input is analysed and published (scheduling/splitting.py)
    dispatch   WORK is about to go to a worker (F443 §3 step 3), written before it is sent
    commit     the result's manifest (campaign/commit.py), written before anything of it
               is published (F443 §3 step 6): a master taking over redoes it from this
    requeue    a dispatch was taken back (a protocol recovery, a shutdown, a resume)
    recovered  a failure was recovered from: its in-flight work went back to the frontier
    epoch      an epoch of the tiers (scheduling/tiers/) begins

Writers build a record of the schema below (the master's write sites, done_log.py's
`record_done`); every reader - resume, takeover, `verify`, compaction - goes through `check`,
which holds each record to the same schema and returns it as the JSON object it is.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec

from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.durable.journal import Damage, DamageKind, inspect
from symcc_mpi.scheduling.splitting import parse_work_id, part_id
from symcc_mpi.wire.protocol import SHA256_PATTERN


class Kind(enum.Enum):
    DONE = "done"  # on disk: no "kind" field (see above)
    PART = "part"
    DISPATCH = "dispatch"
    COMMIT = "commit"
    REQUEUE = "requeue"
    RECOVERED = "recovered"
    EPOCH = "epoch"


Digest = Annotated[str, msgspec.Meta(pattern=SHA256_PATTERN.pattern)]


class _Record(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    # The epoch (tiers/) the record belongs to: written past the first one only.
    epoch: int = 0


class Done(_Record):
    digest: Digest
    token: str
    outcome: str
    time: float
    generation: int = 0  # the communicator generation (ulfm/), past the first one only
    published: list[str] = []  # the children it added to corpus/ (verify: none may go)
    tier: int = 1  # where the input came from (tiers/)


class _Work(_Record, tag_field="kind"):
    pass


class Part(_Work, tag="part"):
    digest: Digest
    part: int
    token: str
    outcome: str
    published: list[str]


class Dispatch(_Work, tag="dispatch"):
    digest: Digest
    token: str
    generation: int
    rank: int | None = None
    part: int | None = None


class Commit(_Work, tag="commit"):
    """Its manifest's fields are campaign/commit.py's (`encode_manifest`); a commit of an
    earlier version holds the whole RESULT instead, under `result`."""

    digest: Digest
    token: str
    generation: int
    rank: int | None = None
    part: int | None = None
    outcome: str | None = None
    # null for a run with no exit status (killed); absent only in an earlier version's record
    exit_status: int | None | msgspec.UnsetType = msgspec.UNSET
    publish: list[list[Any]] | None = None
    message: str | None = None
    result: str | None = None


class Requeue(_Work, tag="requeue"):
    digest: Digest
    reason: str
    part: int | None = None


class Recovered(_Work, tag="recovered"):
    generation: int
    failed: list[str]
    requeued: list[str]  # work ids (splitting.py)
    master: str | None = None  # "kept" or "new"
    seconds: float | None = None


class Epoch(_Work, tag="epoch"):
    epoch: int  # the one that begins: always written
    time: float | None = None


Record = Done | Part | Dispatch | Commit | Requeue | Recovered | Epoch
WorkRecord = Part | Dispatch | Commit | Requeue | Recovered | Epoch
SCHEMA: dict[Kind, type[Record]] = {
    Kind.DONE: Done, Kind.PART: Part, Kind.DISPATCH: Dispatch, Kind.COMMIT: Commit,
    Kind.REQUEUE: Requeue, Kind.RECOVERED: Recovered, Kind.EPOCH: Epoch,
}
_KINDS = {kind.value: kind for kind in Kind if kind is not Kind.DONE}


def kind_of(record: dict) -> Kind:
    """The kind of a record as read (ValueError for one no version writes)."""
    kind = record.get("kind")
    if kind is None:
        return Kind.DONE
    try:
        return _KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown record kind {kind!r}") from None


def is_done(record: dict) -> bool:
    return "kind" not in record


def encode(record: Record) -> dict:
    """The JSON object a record is written as."""
    return msgspec.to_builtins(record)


def check(record: dict) -> dict:
    """`record` if it holds to the schema of its kind, else ValueError saying why. A record of
    layout 1 (campaign/layout.py), which named the input's SHA-256 `sha256`, is returned as
    this layout names it."""
    if "sha256" in record and "digest" not in record:
        record["digest"] = record.pop("sha256")
    try:
        msgspec.convert(record, SCHEMA[kind_of(record)])
    except msgspec.ValidationError as error:
        raise ValueError(f"{record.get('kind', 'done')} record: {error}") from None
    return record


def read(path: Path, *, after: tuple[int, int] = (0, 0)) -> tuple[list[dict], Damage | None]:
    """Every record of the journal at `path`, checked, read-only (any process, live campaign
    or not), and its torn last line if any (left in place). A bad line before the last is a
    CorruptJournal naming the file and line. `after`: a prefix not read (inspect)."""
    records: list[dict] = []
    damage = inspect(path, lambda record: records.append(check(record)), after=after)
    torn = None
    for item in damage:  # only the last line can be torn
        if item.kind is not DamageKind.TORN_TAIL:
            raise CorruptJournal(item)
        torn = item
    return records, torn


class CorruptJournal(CampaignError):
    """A journal line before the last is damaged or holds no record of the schema."""

    def __init__(self, damage: Damage):
        super().__init__(f"corrupt state file {damage.path}, line {damage.line}: "
                         f"{damage.reason}")
        self.damage = damage


def work_of(record: dict) -> str:
    """The work id a dispatch, requeue, commit or part record is about (splitting.py)."""
    part = record.get("part")
    return record["digest"] if part is None else part_id(record["digest"], part)


@dataclass(frozen=True)
class Epochs:
    """A journal read by epoch (tiers/schedule.py): the epoch in progress, the inputs done
    in it, those done only in earlier ones, and the records of the epoch in progress."""

    epoch: int
    done: set[str]
    done_before: set[str]
    current: list[dict]


def replay_epochs(journal: list[dict], *, epoch: int = 0) -> Epochs:
    """An epoch begins only when no work is in flight: every record of an earlier epoch is
    settled, and what a resume redoes, requeues or counts in flight is in `current`.
    `epoch`: the one in progress when `journal` begins (a snapshot's)."""
    epoch = max((r["epoch"] for r in journal if r.get("kind") == Kind.EPOCH.value),
                default=epoch)
    current = [r for r in journal if r.get("epoch", 0) == epoch]
    done = {r["digest"] for r in current if is_done(r)}
    before = {r["digest"] for r in journal if is_done(r) and r.get("epoch", 0) < epoch}
    return Epochs(epoch, done, before - done, current)


def settled_work_lines(journal: list[dict]) -> set[int]:
    """The line numbers of the dispatch and commit records of whole inputs dispatched once
    in their epoch and done there, with no take-back on record: nothing reads them again."""
    open_lines: dict[tuple[int, str], list[int]] = {}
    dispatches: Counter[tuple[int, str]] = Counter()
    declared: set[tuple[int, str]] = set()
    settled: set[int] = set()
    for number, record in enumerate(journal):
        kind, epoch = kind_of(record), record.get("epoch", 0)
        if kind in (Kind.DISPATCH, Kind.COMMIT) and record.get("part") is None:
            key = (epoch, record["digest"])
            open_lines.setdefault(key, []).append(number)
            dispatches[key] += kind is Kind.DISPATCH
        elif kind is Kind.REQUEUE:
            declared.add((epoch, record["digest"]))
        elif kind is Kind.RECOVERED:
            declared.update((epoch, parse_work_id(work)[0]) for work in record["requeued"])
        elif kind is Kind.DONE:
            key = (epoch, record["digest"])
            lines = open_lines.pop(key, [])
            if dispatches.pop(key, 0) == 1 and key not in declared:
                settled.update(lines)
            declared.discard(key)
    return settled


def outstanding(journal: list[dict]) -> set[str]:
    """The work (ids: splitting.py) whose last dispatch the journal records as neither
    committed nor taken back."""
    out: set[str] = set()
    for record in journal:
        kind = kind_of(record)
        if kind is Kind.DISPATCH:
            out.add(work_of(record))
        elif kind is Kind.RECOVERED:
            out.difference_update(record["requeued"])
        elif kind in (Kind.REQUEUE, Kind.PART):
            out.discard(work_of(record))
        elif kind is Kind.DONE:  # the input is done: so are all its parts
            out = {work for work in out if parse_work_id(work)[0] != record["digest"]}
    return out


def committed_parts(journal: list[dict]) -> set[str]:
    """The parts (of split inputs not done) whose last record is their commit: not taken
    back since (a part set aside with its input declares those of its input committed)."""
    last_committed: dict[str, bool] = {}
    for record in journal:
        kind = kind_of(record)
        if kind in (Kind.PART, Kind.REQUEUE) and record.get("part") is not None:
            last_committed[work_of(record)] = kind is Kind.PART
        elif kind is Kind.DONE:
            for work in [w for w in last_committed if parse_work_id(w)[0] == record["digest"]]:
                del last_committed[work]
    return {work for work, committed in last_committed.items() if committed}
