"""Shared work WAL (F443 §2-§5): per work identity a fenced token and a commit manifest.

One record file per work identity, `root/<2 hex>/<work_id>`, written whole with
`write_durable` (temp, fsync, rename, directory fsync) and checksummed like a journal line, so a
reader sees the previous record or the next one and a damaged file is recognised.

States and the F443 §3 step 6 order of a result's commit:

    begin(token)            -> LEASED       the work is out with a worker under `token`
    commit_manifest(...)    -> COMMITTING   staged objects verified and fsynced, then the
                                            manifest made durable: the irreversible decision
    (caller: finish the QueryStore lease)
    publish(...)                            link staging/<sha256> to corpus/<sha256>
    done(...)               -> DONE

On reopen `recover()` first redoes every COMMITTING record (publication is idempotent: an object
already in the corpus with the right bytes counts as published) and then reclaims every LEASED
record with zero TTL (F443 §4 step 7): its record is removed and the work is handed back to be
dispatched again under a new token. The §5 table is why this is enough: a crash before the
manifest is durable loses only a lease (re-dispatch); a crash after it loses nothing (redo).

Publication hard-links a staged file into the corpus, so staged files must never be rewritten
in place once their manifest is committed (the staging directory is removed after `done`).

The WAL checks tokens (a stale holder's late calls are refused) but does not arbitrate between
processes racing on one work identity: exclusive ownership of a work identity comes from the
fenced lease table (F320, `durable/leases.py`) or, under ULFM, from the single master.
"""

from __future__ import annotations

import enum
import errno
import functools
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import fsync_directory, is_temporary, remove_durable, write_durable
from .clock import SYSTEM_CLOCK, Clock
from .journal import Damage, DamageKind, LineError, decode_line, encode_line

log = logging.getLogger(__name__)

RecordWriter = Callable[[Path, bytes], None]
RecordRemover = Callable[[Path], bool]

WORK_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,127}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
SCHEMA = 1
_SHARD = re.compile(r"^[0-9a-f]{2}$")


class WorkState(enum.Enum):
    LEASED = "leased"
    COMMITTING = "committing"
    DONE = "done"


class WalError(Exception):
    """Base of the WAL errors; each message is one line naming the work or the path."""


class WalConflict(WalError):
    """The call does not match the record (stale token, wrong state): nothing was written."""

    def __init__(self, message: str, current: WalRecord | None):
        super().__init__(message)
        self.current = current


class WalCorrupt(WalError):
    """A record file is damaged; `recover()` quarantines such files."""


class ObjectMissing(WalError):
    """A manifest object is neither in the corpus nor in its staging directory."""


class ObjectCorrupt(WalError):
    """A staged or published object's bytes do not hash to its name."""


@dataclass(frozen=True)
class Manifest:
    """What a result publishes: `staging/<sha256>` for each listed SHA-256."""

    staging: Path
    objects: tuple[str, ...]

    def __post_init__(self) -> None:
        objects = tuple(sorted(set(self.objects)))
        for digest in objects:
            if not isinstance(digest, str) or not SHA256_HEX.match(digest):
                raise ValueError(f"manifest object {digest!r} is not a lowercase SHA-256")
        object.__setattr__(self, "objects", objects)
        object.__setattr__(self, "staging", Path(os.path.abspath(self.staging)))

    def to_json(self) -> dict[str, Any]:
        return {"staging": str(self.staging), "objects": list(self.objects)}

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        if not isinstance(data, dict) or not isinstance(data.get("staging"), str) \
                or not isinstance(data.get("objects"), list):
            raise ValueError("manifest is malformed")
        return cls(Path(data["staging"]), tuple(data["objects"]))


@dataclass(frozen=True)
class WalRecord:
    work_id: str
    token: str
    state: WorkState
    manifest: Manifest | None
    updated: float

    def to_json(self) -> dict[str, Any]:
        return {"v": SCHEMA, "work": self.work_id, "token": self.token,
                "state": self.state.value, "updated": self.updated,
                "manifest": None if self.manifest is None else self.manifest.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WalRecord:
        try:
            if data["v"] != SCHEMA:
                raise ValueError(f"unknown schema {data['v']!r}")
            record = cls(data["work"], data["token"], WorkState(data["state"]),
                         None if data["manifest"] is None
                         else Manifest.from_json(data["manifest"]), float(data["updated"]))
        except (KeyError, TypeError) as error:
            raise ValueError(f"record is malformed: {error!r}") from None
        _check_work_id(record.work_id)
        _check_token(record.token)
        if (record.manifest is None) != (record.state is WorkState.LEASED):
            raise ValueError("a manifest belongs to committing and done records only")
        return record


@dataclass(frozen=True)
class Publication:
    work_id: str
    linked: tuple[str, ...]  # put into the corpus by this call
    present: tuple[str, ...]  # already there with the right bytes (a redo, or shared content)


@dataclass(frozen=True)
class Recovery:
    redone: tuple[str, ...]  # committing records published and marked done
    reclaimed: tuple[str, ...]  # leased records removed: dispatch these again
    failed: tuple[tuple[str, str], ...]  # (work_id, one-line reason): left committing
    quarantined: tuple[Damage, ...]  # damaged record files moved aside, with their paths
    done: int  # records already done


@dataclass(frozen=True)
class WalStatistics:
    begins: int
    commits: int
    publications: int
    dones: int
    abandons: int
    conflicts: int
    redone: int
    reclaimed: int
    quarantined: int


def _check_work_id(work_id: str) -> None:
    if not isinstance(work_id, str) or not WORK_ID.match(work_id):
        raise ValueError(f"work id {work_id!r} is not 1-128 characters of [0-9A-Za-z._-] "
                         "starting with a letter or digit")


def _check_token(token: str) -> None:
    if not isinstance(token, str) or not token or len(token) > 256:
        raise ValueError("token must be a non-empty string of at most 256 characters")


def sha256_file(path: Path, *, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
        if fsync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


class WorkWAL:
    """The shared work WAL under `root`, publishing into `corpus`."""

    def __init__(self, root: Path, corpus: Path, *, clock: Clock = SYSTEM_CLOCK,
                 fsync: bool = True, writer: RecordWriter | None = None,
                 remover: RecordRemover | None = None, quarantine_dir: Path | None = None):
        self.root = Path(root)
        self.corpus = Path(corpus)
        self.quarantine_dir = quarantine_dir or self.root / "quarantine"
        self._clock = clock
        self._fsync = fsync
        self._writer = writer or functools.partial(write_durable, fsync=fsync)
        self._remover = remover or functools.partial(remove_durable, fsync=fsync)
        self._shards: set[str] = set()
        self._counts = dict.fromkeys(
            ("begins", "commits", "publications", "dones", "abandons", "conflicts", "redone",
             "reclaimed", "quarantined"), 0)
        for directory in (self.root, self.corpus):
            if not directory.is_dir():
                directory.mkdir(parents=True, exist_ok=True)
                if fsync:
                    fsync_directory(directory.parent)

    # -- records on disk -------------------------------------------------------------------

    def path_of(self, work_id: str) -> Path:
        _check_work_id(work_id)
        shard = hashlib.sha256(work_id.encode()).hexdigest()[:2]
        return self.root / shard / work_id

    def get(self, work_id: str) -> WalRecord | None:
        path = self.path_of(work_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return self._decode(path, raw)

    def _decode(self, path: Path, raw: bytes) -> WalRecord:
        try:
            if not raw.endswith(b"\n") or raw.count(b"\n") != 1:
                raise LineError("not exactly one newline-terminated record")
            record = WalRecord.from_json(decode_line(raw[:-1]))
            if record.work_id != path.name:
                raise ValueError(f"record names work {record.work_id!r}")
        except ValueError as error:
            raise WalCorrupt(f"corrupt WAL record {path}: {error}") from None
        return record

    def _write(self, record: WalRecord) -> WalRecord:
        path = self.path_of(record.work_id)
        shard = path.parent.name
        if shard not in self._shards:
            if not path.parent.is_dir():
                path.parent.mkdir(exist_ok=True)
                if self._fsync:
                    fsync_directory(self.root)
            self._shards.add(shard)
        # A failing writer leaves the old record (write_durable cleans its temporary) or, if
        # it failed after its rename, the new one: callers repeat the call, which is safe.
        self._writer(path, encode_line(record.to_json()))
        return record

    def _record(self, work_id: str, token: str, state: WorkState,
                manifest: Manifest | None) -> WalRecord:
        return WalRecord(work_id, token, state, manifest, self._clock.time())

    def _conflict(self, message: str, current: WalRecord | None) -> WalConflict:
        self._counts["conflicts"] += 1
        return WalConflict(message, current)

    # -- the life of one work identity -------------------------------------------------------

    def begin(self, work_id: str, token: str) -> WalRecord:
        """Record that `work_id` is leased under `token` (a repeat returns the record)."""
        _check_token(token)
        current = self.get(work_id)
        if current is not None:
            if current.state is WorkState.LEASED and current.token == token:
                return current
            raise self._conflict(f"work {work_id} is {current.state.value} under "
                                 f"{'this' if current.token == token else 'another'} token",
                                 current)
        record = self._write(self._record(work_id, token, WorkState.LEASED, None))
        self._counts["begins"] += 1
        return record

    def commit_manifest(self, work_id: str, token: str, manifest: Manifest) -> WalRecord:
        """The commit decision: staged objects verified and durable, then the manifest."""
        _check_token(token)
        current = self._require(work_id, token)
        if current.state is not WorkState.LEASED:
            if current.manifest == manifest:
                return current  # a repeat: committing or done already
            raise self._conflict(f"work {work_id} is {current.state.value} with another "
                                 "manifest", current)
        for digest in manifest.objects:
            # F443 §5: after this record is durable the publication must be redoable, so the
            # staged bytes must be right and on disk before it is written.
            staged = manifest.staging / digest
            try:
                actual = sha256_file(staged, fsync=self._fsync)
            except FileNotFoundError:
                raise ObjectMissing(f"staged object {staged} is missing") from None
            if actual != digest:
                raise ObjectCorrupt(f"staged object {staged} hashes to {actual}")
        if manifest.objects and self._fsync:
            fsync_directory(manifest.staging)
        record = self._write(self._record(work_id, token, WorkState.COMMITTING, manifest))
        self._counts["commits"] += 1
        return record

    def publish(self, work_id: str, token: str) -> Publication:
        """Link every manifest object into the corpus (idempotent)."""
        _check_token(token)
        current = self._require(work_id, token)
        if current.state is WorkState.LEASED:
            raise self._conflict(f"work {work_id} has no commit manifest to publish", current)
        assert current.manifest is not None
        if current.state is WorkState.DONE:
            return Publication(work_id, (), current.manifest.objects)
        return self._publish(current)

    def _publish(self, record: WalRecord) -> Publication:
        assert record.manifest is not None
        linked, present = [], []
        for digest in record.manifest.objects:
            if self._publish_one(record.manifest.staging, digest):
                linked.append(digest)
            else:
                present.append(digest)
        if record.manifest.objects and self._fsync:
            fsync_directory(self.corpus)  # the links must be durable before `done` is
        self._counts["publications"] += 1
        return Publication(record.work_id, tuple(linked), tuple(present))

    def _publish_one(self, staging: Path, digest: str) -> bool:
        target = self.corpus / digest
        if target.exists():
            self._verify_published(target, digest)
            return False
        source = staging / digest
        try:
            actual = sha256_file(source)
        except FileNotFoundError:
            raise ObjectMissing(f"staged object {source} is missing and {target} is not "
                                "published") from None
        if actual != digest:
            raise ObjectCorrupt(f"staged object {source} hashes to {actual}")
        try:
            os.link(source, target)
        except FileExistsError:
            self._verify_published(target, digest)  # another publisher of the same content
            return False
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                raise
            # No hard links here: a durable copy is the same publication, temp then rename.
            data = source.read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                raise ObjectCorrupt(f"staged object {source} changed while published") from None
            write_durable(target, data, fsync=self._fsync)
        return True

    def _verify_published(self, target: Path, digest: str) -> None:
        actual = sha256_file(target)
        if actual != digest:
            raise ObjectCorrupt(f"corpus object {target} hashes to {actual}")

    def done(self, work_id: str, token: str) -> WalRecord:
        """Close the record after publication (a repeat returns the record)."""
        _check_token(token)
        current = self._require(work_id, token)
        if current.state is WorkState.DONE:
            return current
        if current.state is WorkState.LEASED:
            raise self._conflict(f"work {work_id} has no commit manifest", current)
        assert current.manifest is not None
        for digest in current.manifest.objects:
            if not (self.corpus / digest).exists():
                raise ObjectMissing(f"work {work_id}: {self.corpus / digest} is not published")
        record = self._write(self._record(work_id, token, WorkState.DONE, current.manifest))
        self._counts["dones"] += 1
        return record

    def abandon(self, work_id: str, token: str) -> bool:
        """Give back a lease before its commit (F313 shared exact-work `abandon`): the record
        is removed. False if there was none; committing and done records are refused."""
        _check_token(token)
        current = self.get(work_id)
        if current is None:
            return False
        if current.state is not WorkState.LEASED or current.token != token:
            raise self._conflict(f"work {work_id} is {current.state.value}; only the current "
                                 "pre-commit token can abandon it", current)
        self._remover(self.path_of(work_id))
        self._counts["abandons"] += 1
        return True

    def _require(self, work_id: str, token: str) -> WalRecord:
        current = self.get(work_id)
        if current is None:
            raise self._conflict(f"work {work_id} has no WAL record", None)
        if current.token != token:
            raise self._conflict(f"work {work_id}: stale token", current)
        return current

    # -- reopening -------------------------------------------------------------------------

    def scan(self) -> Iterator[tuple[Path, WalRecord | WalCorrupt]]:
        """Every record file with its record or its damage (temporaries skipped)."""
        if not self.root.is_dir():
            return
        for shard in sorted(self.root.iterdir()):
            if not shard.is_dir() or not _SHARD.match(shard.name):
                continue
            for path in sorted(shard.iterdir()):
                if is_temporary(path):
                    continue
                try:
                    yield path, self._decode(path, path.read_bytes())
                except WalCorrupt as error:
                    yield path, error

    def records(self) -> Iterator[WalRecord]:
        for _, item in self.scan():
            if isinstance(item, WalRecord):
                yield item

    def recover(self) -> Recovery:
        """F443 §4 step 7: redo every committing record, then reclaim every leased one with
        zero TTL. Damaged record files are moved to the quarantine directory and reported;
        they never stop the others from being recovered. Running it twice is harmless."""
        self._sweep_temporaries()
        committing: list[WalRecord] = []
        leased: list[WalRecord] = []
        quarantined: list[Damage] = []
        done = 0
        for path, item in self.scan():
            if isinstance(item, WalCorrupt):
                quarantined.append(self._quarantine(path, str(item)))
            elif item.state is WorkState.COMMITTING:
                committing.append(item)
            elif item.state is WorkState.LEASED:
                leased.append(item)
            else:
                done += 1
        redone, failed = [], []
        for record in committing:
            try:
                self._publish(record)
                self.done(record.work_id, record.token)
            except (WalError, OSError) as error:
                # Left committing (F321: never stolen, never rolled back): an operator must
                # restore the staged bytes; the other records still recover.
                failed.append((record.work_id, str(error)))
                log.error("WAL redo of %s failed: %s", record.work_id, error)
            else:
                redone.append(record.work_id)
        reclaimed = []
        for record in leased:
            self._remover(self.path_of(record.work_id))
            reclaimed.append(record.work_id)
        self._counts["redone"] += len(redone)
        self._counts["reclaimed"] += len(reclaimed)
        return Recovery(tuple(redone), tuple(reclaimed), tuple(failed), tuple(quarantined),
                        done)

    def _sweep_temporaries(self) -> None:
        # A writer killed inside write_durable leaves `.tmp-<work>.<pid>`; it was never the
        # record, so removing it loses nothing. Recovery runs when no other writer is live.
        for shard in self.root.iterdir() if self.root.is_dir() else ():
            if shard.is_dir() and _SHARD.match(shard.name):
                for path in shard.iterdir():
                    if is_temporary(path):
                        path.unlink(missing_ok=True)

    def _quarantine(self, path: Path, reason: str) -> Damage:
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        target = self.quarantine_dir / f"{path.name}.{self._clock.time():.6f}"
        serial = 0
        while target.exists():
            serial += 1
            target = self.quarantine_dir / f"{path.name}.{self._clock.time():.6f}.{serial}"
        os.rename(path, target)
        if self._fsync:
            fsync_directory(self.quarantine_dir)
            fsync_directory(path.parent)
        self._counts["quarantined"] += 1
        damage = Damage(path, 1, DamageKind.CORRUPT_LINE, reason, target)
        log.warning("WAL damage: %s", damage)
        return damage

    def statistics(self) -> WalStatistics:
        return WalStatistics(**self._counts)

    def states(self) -> dict[WorkState, int]:
        counts = dict.fromkeys(WorkState, 0)
        for record in self.records():
            counts[record.state] += 1
        return counts

