"""The AFL face of the corpus: queue/, crashes/, hangs/ and the ids that name their entries.

Every entry is a hard link to its corpus/ file where the filesystem allows one (a copy
otherwise), named as afl-fuzz names its own (`id:NNNNNN,src:...,op:symcc`, afl_names.py), ids
dense from 0 and taken only once the entry is published: AFL's sync (`-F`, `-M`/`-S`) reads
any `id:` name it sees, and finds its place by the highest id. A master other than the first
names nothing here: it hands each finding to the first master (federation/), which keeps the
ids in order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from symcc_mpi.campaign.afl_names import afl_queue_name, parse_afl_queue_id
from symcc_mpi.campaign.layout import FINDINGS, MASTER_STATE, sha256_file
from symcc_mpi.campaign.published import PublishLog
from symcc_mpi.durable.atomic import make_directories, publish_link, write_durable
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.protocol import SHA256_PATTERN, Finding, FindingKind


class AflQueues:
    """The AFL-named entries of a campaign directory, as its master (corpus.CampaignDir)
    publishes them; the entry for an input is a link to `corpus/<digest>`."""

    def __init__(self, out: Path, inputs: Frontier, state: Path):
        self.out = out
        self.inputs = inputs  # the frontier: it holds each input's queue id
        self.state = state
        self.corpus = out / "corpus"
        self.queue = out / "queue"
        self.crashes = out / "crashes"
        self.hangs = out / "hangs"
        self.quarantine = out / "quarantine"
        # Strings, not Paths, on the master's per-result path: a Path join costs ~25 µs.
        self._corpus, self._queue = str(self.corpus), str(self.queue)
        self.crash_digests: set[str] = set()
        self.hang_digests: set[str] = set()
        self._next_ids = {"queue": 0, "crashes": 0, "hangs": 0}
        self._repaired: set[str] = set()  # _repair_entry's
        # Each queue/ entry's name by digest, kept when asked for (a hybrid campaign ranks
        # its frontier by them, afl_sync.helper_rank); set before `read_queues`.
        self.keep_queue_names = False
        self.queue_names: dict[str, str] = {}
        # A master other than the first names nothing in queue/, crashes/, hangs/: it hands
        # each finding to the first master (federation.py), which keeps AFL's ids in order.
        self.forward_finding: Callable[[Finding], None] | None = None
        self.publish_log = PublishLog(state)  # what is published after the last snapshot

    def _published(self, path: str) -> None:
        """A file just appeared under its final name (the master's group commit syncs it)."""
        raise NotImplementedError

    def read_queues(self) -> None:
        """Rebuild hash -> AFL id maps and next ids from queue/, crashes/, hangs/.

        AFL entries are hard links to corpus/ files (or to staged files promoted there), so
        an inode names its digest without reading the bytes; only a copy is hashed.
        """
        by_inode = {}
        with os.scandir(self.corpus) as entries:
            for entry in entries:
                if SHA256_PATTERN.match(entry.name):
                    by_inode[entry.inode()] = entry.name
        for kind, directory in (("queue", self.queue), ("crashes", self.crashes),
                                ("hangs", self.hangs)):
            with os.scandir(directory) as entries:
                named = [(entry, parse_afl_queue_id(entry.name)) for entry in entries]
            for entry, entry_id in named:
                if entry_id is None:
                    continue
                self._next_ids[kind] = max(self._next_ids[kind], entry_id + 1)
                digest = by_inode.get(entry.inode()) or sha256_file(Path(entry.path))
                if kind == "queue":
                    if self.inputs.queue_id(digest) is None:
                        self.inputs.set_queue_id(digest, entry_id)
                        if self.keep_queue_names:
                            self.queue_names[digest] = entry.name
                elif kind == "crashes":
                    self.crash_digests.add(digest)
                else:
                    self.hang_digests.add(digest)

    def add_to_queue(self, digest: str, parent: str) -> None:
        if self.forward_finding is not None:
            self.forward_finding(Finding(FindingKind.QUEUE, digest, parent))
            return
        if not self._repair_entry(digest):
            self._add_to_queue(digest, sources=self._source_ids(parent))

    def queue_once(self, digest: str, parent: str) -> None:
        """corpus/<digest> was published already (by another master, or by this master's
        dead predecessor, whose message to the first master may have died with it): its
        queue/ entry, if it has none yet, named once by the first master."""
        if self.forward_finding is not None:
            self.forward_finding(Finding(FindingKind.QUEUE, digest, parent))
        else:
            self.queue_finding(digest, parent)

    def queue_finding(self, digest: str, parent: str) -> bool:
        """Another master kept corpus/<digest>: its queue/ entry, once (the first master)."""
        if not os.path.exists(os.path.join(self._corpus, digest)):
            return False
        if self._repair_entry(digest):
            return True
        if self.inputs.queue_id(digest) is not None:
            return False
        self._add_to_queue(digest, sources=self._source_ids(parent))
        return True

    def _repair_entry(self, digest: str) -> bool:
        """corpus/<digest> is published again after its file was found damaged and
        quarantined (a power failure kept its name and lost its bytes): the queue/ entry
        that still links the damaged inode is made to link the new file, under its own name
        and id. False if there is none (the usual case: one stat)."""
        if digest in self._repaired:
            return False
        try:
            damaged = os.stat(self.quarantine / f"corpus-{digest}").st_ino
        except FileNotFoundError:
            return False
        self._repaired.add(digest)  # one scan of queue/ per damaged input
        with os.scandir(self.queue) as entries:
            linked = [entry for entry in entries if entry.inode() == damaged]
        for entry in linked:
            if (entry_id := parse_afl_queue_id(entry.name)) is None:
                continue
            self.publish_log.intend("queue", digest, entry.name)
            publish_link(os.path.join(self._corpus, digest), entry.path, replace=True)
            self._published(entry.path)
            self.inputs.set_queue_id(digest, entry_id)
            return True
        return False

    def _add_to_queue(self, digest: str, *, sources: tuple[int, ...] = (),
                      orig: str | None = None, op: str | None = "symcc",
                      sync: str | None = None, new_coverage: bool = False) -> None:
        entry_id = self._next_ids["queue"]
        name = afl_queue_name(entry_id, sources, op, orig=orig, sync=sync, new_cov=new_coverage)
        target = os.path.join(self._queue, name)
        self.publish_log.intend("queue", digest, name)
        publish_link(os.path.join(self._corpus, digest), target)
        self._take_id("queue")  # only once published: a failed link leaves no gap in the ids
        self._published(target)
        self.inputs.set_queue_id(digest, entry_id)
        if self.keep_queue_names:
            self.queue_names[digest] = name

    def save_finding(self, kind: FindingKind, digest: str, parent: str | None,
                     signal: int | None = None, *, data: bytes | None = None) -> bool:
        """Record a crashing or hanging input once; False if it is known already. `data`: the
        verified bytes of a child that is not in corpus/; without it, corpus/<digest>."""
        kind = FindingKind(kind)
        known = self.crash_digests if kind is FindingKind.CRASHES else self.hang_digests
        if digest in known:
            return False
        if self.forward_finding is not None:
            if data is not None:  # durable here first: the message may die with its receiver
                kept = self.state / FINDINGS / kind.value / digest
                make_directories(kept.parent)
                write_durable(kept, data, fsync=False)  # synced at the group commit
                self._published(str(kept))
            self.forward_finding(Finding(kind, digest, parent or "", signal, data or b""))
            known.add(digest)
            return True
        name = afl_queue_name(self._next_ids[kind.value], self._source_ids(parent), sig=signal)
        directory = self.crashes if kind is FindingKind.CRASHES else self.hangs
        target = os.path.join(directory, name)
        self.publish_log.intend(kind.value, digest, name)
        if data is None:
            publish_link(os.path.join(self._corpus, digest), target)
        else:
            write_durable(Path(target), data, fsync=False)  # synced at the group commit
        self._take_id(kind.value)
        self._published(target)
        known.add(digest)
        return True

    def adopt_findings(self) -> int:
        """The crashes and hangs other masters kept in their state and the first master did
        not name before the job ended (its message lost with it): named now, without their
        parent. Returns how many."""
        adopted = 0
        for kind in (FindingKind.CRASHES, FindingKind.HANGS):
            for path in sorted(self.out.glob(f"state/{MASTER_STATE.format('*')}/{FINDINGS}/"
                                             f"{kind.value}/*")):
                if SHA256_PATTERN.match(path.name) and path.is_file():
                    adopted += self.save_finding(kind, path.name, None,
                                                 data=path.read_bytes())
        return adopted

    def unnamed_findings(self, parents: dict[str, str]) -> list[Finding]:
        """What a master other than the first handed it and may not be named: the kept
        children of `parents` (child -> the input it came from, as this master's journal has
        them) without a queue/ entry, and every crash and hang this master kept in its state.
        A master taking a dead one's place hands them again: the messages may have died
        with the dead one (the first master names each once)."""
        findings = [Finding(FindingKind.QUEUE, child, parent)
                    for child, parent in sorted(parents.items())
                    if self.inputs.queue_id(child) is None
                    and os.path.exists(os.path.join(self._corpus, child))]
        for kind in (FindingKind.CRASHES, FindingKind.HANGS):
            kept = self.state / FINDINGS / kind.value
            for path in sorted(kept.iterdir()) if kept.is_dir() else ():
                if SHA256_PATTERN.match(path.name) and path.is_file():
                    findings.append(Finding(kind, path.name, "", None, path.read_bytes()))
        return findings

    def _source_ids(self, parent: str | None) -> tuple[int, ...]:
        source = self.inputs.queue_id(parent) if parent else None
        return () if source is None else (source,)

    @property
    def next_ids(self) -> dict[str, int]:
        return dict(self._next_ids)

    @property
    def queue_entries(self) -> int:
        """queue/ ids run from 0 to this, dense (AFL's sync needs them so)."""
        return self._next_ids["queue"]

    def _take_id(self, kind: str) -> int:
        entry_id = self._next_ids[kind]
        self._next_ids[kind] = entry_id + 1
        return entry_id
