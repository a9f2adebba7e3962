"""The fuzzers' side of a hybrid campaign (`explore --afl-sync AFL_OUT --name NAME`).

The campaign lives in AFL_OUT/NAME, so every AFL++ instance started with `-o AFL_OUT` imports
its queue/ with its ordinary sync. In the other direction, `FleetQueues` reads the queue/ of
every other instance under AFL_OUT, from where it stopped last (one cursor per instance, the
next AFL id, as AFL's own `.synced/` does), and `Importer` brings the new entries in: into
corpus/ by content (an input two instances hold under different names is one input), into
queue/ as `id:N,sync:INSTANCE,src:ID` (AFL's provenance), through afl-showmap into the triage
map (so what the campaign keeps adds coverage to what the whole fleet has), and into the
frontier, ranked as SymCC's fuzzing helper ranks AFL's entries (`helper_rank`).

The cursors are saved after the group commit that made the imports durable (checkpoint.py): a
crash in between imports those entries again, and their content makes that a no-op.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.campaign.afl_names import parse_afl_queue_id
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.coverage.edges import TriageError
from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.scheduling.frontier import Frontier

log = logging.getLogger("symcc_mpi.campaign.afl_sync")

# afl-fuzz accepts -M/-S names of these characters; the campaign's --name is one of them.
INSTANCE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CURSORS_FILE = "afl-sync.json"
AFL_MAX_FILE = 1 << 20  # afl-fuzz's MAX_FILE: no queue entry of a fuzzer is larger
# afl-fuzz writes a queue entry in place (open O_EXCL, then write): an entry younger than this
# may still be partial, and is left for the next scan. So is one whose mtime is not that far
# in the past by the clock (set back since, or another host's), until it is seen unchanged
# for as long.
MIN_AGE = 1.0
SCAN_INTERVAL = 1.0
IMPORT_BATCH = 64  # entries per master round: each costs an afl-showmap run on the master
IMPORTED_BY_INTERVAL = 10.0
_SYNC_SOURCE = re.compile(r",sync:([^,]+),")


def check_instance_name(name: str) -> str:
    if not INSTANCE_NAME.fullmatch(name):
        raise ValueError(f"--name {name!r}: use letters, digits, '-' and '_' only (as "
                         "afl-fuzz -S does), at most 64")
    return name


def helper_rank(name: str, size: int, queue_id: int) -> tuple[bool, bool, int, int]:
    """symcc_fuzzing_helper's TestcaseScore as a key that sorts the best first: entries AFL
    marked `+cov` (new edges, not only new hit counts), then AFL's seeds (`orig:`), then the
    smaller, then the newer. The campaign's own children are in its queue because they add
    coverage to the whole fleet's map: they rank as `+cov` (named `op:symcc`)."""
    new_coverage = name.endswith("+cov") or ",op:symcc" in name
    return (not new_coverage, "orig:" not in name, size, -queue_id)


@dataclass(frozen=True)
class QueueEntry:
    instance: str
    entry_id: int
    name: str
    path: str


class FleetQueues:
    """The queues of the other AFL++ instances under `sync_dir`, read from per-instance
    cursors (the next AFL id to read). `scan` lists only an instance whose queue/ changed
    since it was last read to its end."""

    def __init__(self, sync_dir: Path, own_name: str, cursors: dict[str, int], *,
                 clock: Clock = SYSTEM_CLOCK, min_age: float = MIN_AGE):
        self.sync_dir = sync_dir
        self.own_name = own_name
        self.cursors = dict(cursors)
        self.clock = clock
        self.min_age = min_age
        self._read_to_end: dict[str, int] = {}  # instance -> queue/ mtime (ns) then
        # entry path -> (size, mtime in ns) and since when (monotonic) it was seen so, for
        # the entries not yet settled by their mtime
        self._settling: dict[str, tuple[tuple[int, int], float]] = {}
        self._warned: set[str] = set()

    def instances(self) -> list[str]:
        """Every other instance: a directory of AFL_OUT with a queue/ in it."""
        try:
            names = sorted(entry.name for entry in os.scandir(self.sync_dir)
                           if entry.is_dir(follow_symlinks=False))
        except OSError as error:
            self._warn_once(f"cannot list {self.sync_dir}: {error.strerror}")
            return []
        return [name for name in names if name != self.own_name and not name.startswith(".")
                and os.path.isdir(os.path.join(self.sync_dir, name, "queue"))]

    def scan(self, limit: int) -> list[QueueEntry]:
        """Up to `limit` entries not read yet, per instance in AFL id order."""
        found: list[QueueEntry] = []
        now, steady = self.clock.time(), self.clock.monotonic()
        for instance in self.instances():
            if len(found) >= limit:
                break
            queue = os.path.join(self.sync_dir, instance, "queue")
            try:
                changed = os.stat(queue).st_mtime_ns
                if self._read_to_end.get(instance) == changed:
                    continue
                cursor = self.cursors.get(instance, 0)
                entries = [(entry_id, entry) for entry in os.scandir(queue)
                           if (entry_id := parse_afl_queue_id(entry.name)) is not None
                           and entry_id >= cursor]
            except FileNotFoundError:
                continue  # the instance went away between the listing and now
            except OSError as error:
                self._warn_once(f"cannot read {queue}: {error.strerror}")
                continue
            entries.sort(key=lambda pair: pair[0])
            complete = True
            for entry_id, entry in entries:
                if len(found) >= limit:
                    complete = False
                    break
                try:
                    status = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not self._settled(entry.path, status, now, steady):
                    complete = False
                    break
                found.append(QueueEntry(instance, entry_id, entry.name, entry.path))
            if complete:
                self._read_to_end[instance] = changed
            else:
                self._read_to_end.pop(instance, None)
        return found

    def _settled(self, path: str, status: os.stat_result, now: float, steady: float) -> bool:
        """Whether the entry at `path` is whole: written at least MIN_AGE ago by its mtime,
        or, if its mtime says otherwise, seen unchanged for MIN_AGE of the steady clock."""
        if now - status.st_mtime >= self.min_age:
            self._settling.pop(path, None)
            return True
        seen = (status.st_size, status.st_mtime_ns)
        before = self._settling.get(path)
        if before is None or before[0] != seen:
            self._settling[path] = (seen, steady)
            return False
        if steady - before[1] < self.min_age:
            return False
        del self._settling[path]
        return True

    def _warn_once(self, problem: str) -> None:
        if problem not in self._warned:
            self._warned.add(problem)
            log.warning("%s: its entries are not imported until it can be read", problem)

    def advance(self, entry: QueueEntry) -> None:
        self.cursors[entry.instance] = max(self.cursors.get(entry.instance, 0),
                                           entry.entry_id + 1)

    def imported_by(self, name: str) -> dict[str, int]:
        """How many entries of each instance's queue/ it imported from instance `name`
        (afl-fuzz names them `id:N,sync:NAME,src:ID`)."""
        counts: dict[str, int] = {}
        for instance in self.instances():
            try:
                names = os.listdir(os.path.join(self.sync_dir, instance, "queue"))
            except OSError:
                continue
            counts[instance] = sum(1 for entry in names
                                   if (m := _SYNC_SOURCE.search(entry)) and m[1] == name)
        return counts


def load_cursors(path: Path) -> dict[str, int]:
    """The saved cursors; an unreadable file starts from the beginning again (with a warning):
    every entry read again is already in the corpus, by content, and is not imported twice."""
    try:
        document = json.loads(path.read_bytes())
        cursors = document["cursors"]
        if not all(isinstance(k, str) and isinstance(v, int) and v >= 0
                   for k, v in cursors.items()):
            raise ValueError("a cursor is not a non-negative integer")
        return cursors
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("%s is unreadable (%s): reading the fuzzers' queues from their start; "
                    "what was imported already is recognised by its content", path, error)
        return {}


@dataclass
class ImportStats:
    imported: Counter[str]  # per instance
    duplicates: int = 0  # entries whose content the campaign held already
    unreadable: int = 0  # not a regular file, too large, or gone
    unprobed: int = 0  # imported while the coverage probe failed: not in the triage map


class Importer:
    """Brings the fleet's new queue entries into the campaign; called by the master once a
    round (the scan itself is paced). `priority` is the frontier's ranking."""

    def __init__(self, campaign: CampaignDir, frontier: Frontier, fleet: FleetQueues, *,
                 probe=None, triage=None, clock: Clock = SYSTEM_CLOCK):
        self.campaign = campaign
        self.frontier = frontier
        self.fleet = fleet
        self.probe = probe  # forkserver.ForkserverProbe over the AFL build, or None
        self.triage = triage  # triage.CoverageMap: the fleet's imports are merged into it
        self.clock = clock
        self.stats = ImportStats(Counter())
        self.next_scan = 0.0
        self.dirty = False  # cursors moved since they were saved
        self.cursors_path = campaign.state / CURSORS_FILE
        self.imported_by: dict[str, int] = {}
        self.next_imported_by = 0.0

    def priority(self, digest: str) -> tuple[bool, bool, int, int]:
        name = self.campaign.queue_names.get(digest, "")
        try:
            size = os.stat(os.path.join(self.campaign.corpus, digest)).st_size
        except FileNotFoundError:
            size = 0
        return helper_rank(name, size, self.frontier.queue_id(digest) or 0)

    def round(self, now: float | None = None) -> int:
        """Import what the fuzzers added since the last scan; returns how many inputs are
        new to the campaign."""
        now = self.clock.monotonic() if now is None else now
        if now < self.next_scan:
            return 0
        entries = self.fleet.scan(IMPORT_BATCH)
        # A full batch means more are waiting: scan again at the next round.
        self.next_scan = now + (0 if len(entries) >= IMPORT_BATCH else SCAN_INTERVAL)
        fresh: dict[str, None] = {}
        for entry in entries:
            data = _read_entry(entry.path)
            if data is None:
                self.stats.unreadable += 1
            else:
                digest = sha256_bytes(data)
                # In the frontier only once probed (below): this batch is checked as well.
                if digest in self.frontier.known or digest in fresh:
                    self.stats.duplicates += 1
                else:
                    self.campaign.import_entry(digest, data, entry.instance, entry.entry_id,
                                               new_coverage=entry.name.endswith("+cov"))
                    self.stats.imported[entry.instance] += 1
                    fresh[digest] = None
            self.fleet.advance(entry)
            self.dirty = True
        if fresh and self.probe is not None and self.triage is not None:
            try:
                for coverage in self.probe.probe([self.campaign.corpus / d for d in fresh]):
                    self.triage.merge(coverage)
            except TriageError as error:
                # The imports stay (they are the fuzzers' finds); the map misses their bits,
                # so a child covering only those may be kept: a duplicate for the fuzzers.
                self.stats.unprobed += len(fresh)
                log.warning("probing %d imported inputs failed (%s): kept without their "
                            "coverage", len(fresh), error)
        for digest in fresh:
            self.frontier.set_depth(digest, 1)
            self.frontier.add(digest)
        return len(fresh)

    def save(self) -> None:
        """Called once the imports so far are durable (after a group commit)."""
        if not self.dirty:
            return
        document = {"version": 1, "sync_dir": str(self.fleet.sync_dir),
                    "cursors": self.fleet.cursors}
        write_durable(self.cursors_path, json.dumps(document, indent=1).encode())
        self.dirty = False

    def figures(self, *, fresh: bool = False) -> dict:
        """The import figures; what the fuzzers took from the campaign is counted from their
        queue/ listings, at most every IMPORTED_BY_INTERVAL unless `fresh`."""
        now = self.clock.monotonic()
        if fresh or now >= self.next_imported_by:
            self.next_imported_by = now + IMPORTED_BY_INTERVAL
            self.imported_by = self.fleet.imported_by(self.fleet.own_name)
        return {"sync_dir": str(self.fleet.sync_dir), "imported": dict(self.stats.imported),
                "duplicates": self.stats.duplicates, "unreadable": self.stats.unreadable,
                "unprobed": self.stats.unprobed, "imported_by": self.imported_by}


def _read_entry(path: str) -> bytes | None:
    """An entry's bytes, if it is a regular file of at most AFL's MAX_FILE bytes (opened
    without following a link, nor waiting on a FIFO, checked on the open descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(AFL_MAX_FILE + 1)
        return data if len(data) <= AFL_MAX_FILE else None
    except OSError:
        return None
    finally:
        os.close(fd)
