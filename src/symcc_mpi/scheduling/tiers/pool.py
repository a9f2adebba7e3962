"""Tier 2: the aside pool of inputs generated, new by content, that triage did not keep.

What triage drops is where a campaign's last edges hide: one that explores every new input
finds them, one that keeps only what adds coverage stops early. The pool keeps those
children for when the interesting frontier is empty, best first by `Promise`:

1. a path (edges and hit-count classes) no kept input and no other pooled input has;
2. the rarest edge it hits: how many kept inputs hit it (fewer first);
3. smaller first (a shorter run, as AFL favours), then older first.

On disk (OUT/aside/) the pool is the staged packs (staging.py) of the results whose children
it took: the master moves a pack there when its commit sets a child aside, instead of
copying children one file each. A pack is removed once none of its children is pending or
in flight, after the group commit that made their done records durable. Bounds: at most
`max_inputs` pending inputs and `max_bytes` of packs (SYMCC_ASIDE_MAX_INPUTS, default
100,000, and SYMCC_ASIDE_MAX_MB, default 256); past them the least promising are dropped
(with their packs, once empty). The pool is not fsynced: a crash of the machine may lose the
children set aside since the last sync, which triage did not want; never a kept input. A
resume rebuilds it from the packs, ranked by size alone.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.config import DEFAULT_ASIDE_MAX_INPUTS, DEFAULT_ASIDE_MAX_MB
from symcc_mpi.durable.regular import open_regular
from symcc_mpi.wire.staging import Pack, PackRejected, Staged

log = logging.getLogger("symcc_mpi.scheduling.tiers")

POOL_DIRECTORY = "aside"
_SLACK = 1.1  # the bounds are enforced down to 1/_SLACK of them once passed, not per offer


@dataclass(frozen=True, order=True)
class Promise:
    """What makes a set-aside input worth exploring; smaller is better (see the module)."""

    repeated_path: bool
    rarity: int
    size: int
    arrival: int


@dataclass
class _Entry:
    token: str  # its pack
    offset: int
    size: int
    promise: Promise
    taken: bool = False  # in flight; analysed or dropped entries are forgotten


@dataclass(frozen=True)
class PoolStatistics:
    pending: int
    in_flight: int
    packs: int
    bytes: int
    set_aside: int  # offered and taken in, over the campaign
    explored: int
    dropped: int  # past the bounds
    max_inputs: int
    max_bytes: int


class AsidePool:
    def __init__(self, directory: Path, *, max_inputs: int = DEFAULT_ASIDE_MAX_INPUTS,
                 max_bytes: int = DEFAULT_ASIDE_MAX_MB << 20):
        self.directory = directory
        self.max_inputs = max_inputs
        self.max_bytes = max_bytes
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[Promise, str]] = []  # pending ones; others skipped lazily
        self._pending = 0
        self._in_flight = 0
        self._packs: dict[str, list[int]] = {}  # token -> [bytes, live entries]
        self._bytes = 0
        self._dead: list[str] = []  # packs with no live entry, removed at `collect`
        self._batch: list[tuple[Staged, Promise]] = []
        self._paths: set[tuple[int, int]] = set()  # pooled entries' paths (triage.path_key)
        self._arrivals = 0
        self.set_aside = 0
        self.explored = 0
        self.dropped = 0

    # -- filling ---------------------------------------------------------------------------

    def promise(self, *, path_key: tuple[int, int], known_path: bool, rarity: int,
                size: int) -> Promise:
        """The rank of a child about to be offered: `known_path`, a kept input has its path."""
        self._arrivals += 1
        return Promise(known_path or path_key in self._paths, rarity, size, self._arrivals)

    def offer(self, staged: Staged, promise: Promise,
              path_key: tuple[int, int] | None = None) -> None:
        """A child of the commit in progress, to set aside if its pack is taken (`adopt`)."""
        self._batch.append((staged, promise))
        if path_key is not None and len(self._paths) < 4 * self.max_inputs:
            self._paths.add(path_key)

    def adopt(self, token: str, pack: str) -> list[str]:
        """Take the commit's offers in: the pack `pack` (the staged pack of dispatch `token`)
        moves into the pool, which now owns it. Returns the children set aside."""
        batch, self._batch = self._batch, []
        if not batch:
            return []
        target = os.path.join(self.directory, token)  # a string: the master's per-result path
        try:
            try:
                os.rename(pack, target)
            except FileNotFoundError:
                self.directory.mkdir(exist_ok=True)  # the first pack set aside, or it is gone
                os.rename(pack, target)
            size = os.stat(target).st_size
        except OSError as error:  # the pool is a heuristic: a lost pack loses nothing kept
            log.warning("could not set aside the children of %s: %s", token[:12], error)
            return []
        self._packs[token] = [size, 0]
        self._bytes += size
        for staged, promise in batch:
            self._add(token, staged, promise)
        self._enforce_bounds()
        return [staged.digest for staged, _ in batch]

    def _add(self, token: str, staged: Staged, promise: Promise) -> None:
        if staged.digest in self._entries:
            return
        self._entries[staged.digest] = _Entry(token, staged.offset, staged.size, promise)
        self._packs[token][1] += 1
        heapq.heappush(self._heap, (promise, staged.digest))
        self._pending += 1
        self.set_aside += 1

    def load(self, seen) -> int:
        """Rebuild the pool from its packs on disk (a resumed campaign): every child not
        `seen(digest)` (known, analysed, or pooled already) is pending again, ranked by its
        size. Returns how many."""
        if not self.directory.is_dir():
            return 0
        loaded = 0
        for path in sorted(self.directory.iterdir()):
            token = path.name
            try:
                with Pack(str(path)) as pack:
                    entries = [e for e in pack.entries if not seen(e.digest)]
            except PackRejected as rejected:
                log.warning("aside pool: %s is not a pack (%s): removed", path, rejected)
                entries = []
            self._packs[token] = [path.stat().st_size if path.is_file() else 0, 0]
            self._bytes += self._packs[token][0]
            for entry in entries:
                self._arrivals += 1
                self._add(token, entry, Promise(False, 0, entry.size, self._arrivals))
                loaded += 1
            if not self._packs[token][1]:
                self._release_pack(token)
        self.set_aside = 0  # counted by the run that set them aside
        self._enforce_bounds()
        self.collect()  # the packs none of whose children waits any more
        return loaded

    # -- exploring ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._pending

    def pending_digests(self) -> list[str]:
        return [digest for digest, entry in self._entries.items() if not entry.taken]

    def __contains__(self, digest: str) -> bool:
        return digest in self._entries

    def best(self) -> str | None:
        heap, entries = self._heap, self._entries
        while heap and (heap[0][1] not in entries or entries[heap[0][1]].taken):
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def take(self, digest: str) -> None:
        entry = self._entries.get(digest)
        if entry is None or entry.taken:
            raise ValueError(f"{digest[:12]} is not pending in the aside pool")
        entry.taken = True
        self._pending -= 1
        self._in_flight += 1

    def read(self, digest: str) -> bytes:
        """A pooled input's bytes, checked against its SHA-256 (raises OSError). Its place in
        the pack is known from the offer: one pread, not the pack's index parsed again."""
        entry = self._entries[digest]
        fd, _ = open_regular(self.directory / entry.token)
        try:
            data = os.pread(fd, entry.size, entry.offset)
        finally:
            os.close(fd)
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != digest:
            raise OSError(f"aside pool, pack {entry.token[:12]}: the bytes of {digest[:12]} "
                          "do not match their SHA-256")
        return data

    def finished(self, digest: str) -> None:
        """A taken input was analysed (committed): its pack may go once the rest has."""
        entry = self._entries.get(digest)
        if entry is None or not entry.taken:
            return
        del self._entries[digest]
        self._in_flight -= 1
        self.explored += 1
        self._unref(entry.token)

    def collect(self) -> None:
        """Remove the packs no entry needs any more: after a group commit, so that the done
        records of the inputs they held are durable first."""
        dead, self._dead = self._dead, []
        for token in dead:
            if self._packs.get(token, [0, 1])[1] == 0:
                self._packs.pop(token)
                try:
                    os.unlink(self.directory / token)
                except FileNotFoundError:
                    pass

    # -- bounds ------------------------------------------------------------------------------

    def _enforce_bounds(self) -> None:
        if self._pending <= self.max_inputs and self._bytes <= self.max_bytes:
            return
        ranked = sorted((e.promise, digest) for digest, e in self._entries.items()
                        if not e.taken)
        # Packs of work in flight stay whatever happens: they count first.
        counted = {e.token for e in self._entries.values() if e.taken}
        budget = self.max_bytes / _SLACK - sum(self._packs[t][0] for t in counted)
        keep = int(self.max_inputs / _SLACK)
        kept = 0
        for _, digest in ranked:
            entry = self._entries[digest]
            size = 0 if entry.token in counted else self._packs[entry.token][0]
            if kept < keep and size <= budget:
                kept += 1
                if entry.token not in counted:
                    counted.add(entry.token)
                    budget -= size
                continue
            del self._entries[digest]  # its digest stays seen: it never returns
            self._pending -= 1
            self.dropped += 1
            self._unref(entry.token)
        self._heap = [(e.promise, d) for d, e in self._entries.items() if not e.taken]
        heapq.heapify(self._heap)

    def _unref(self, token: str) -> None:
        counts = self._packs[token]
        counts[1] -= 1
        if counts[1] == 0:
            self._release_pack(token)

    def _release_pack(self, token: str) -> None:
        self._bytes -= self._packs[token][0]
        self._dead.append(token)

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(pending=self._pending, in_flight=self._in_flight,
                              packs=len(self._packs) - len(self._dead), bytes=self._bytes,
                              set_aside=self.set_aside, explored=self.explored,
                              dropped=self.dropped, max_inputs=self.max_inputs,
                              max_bytes=self.max_bytes)
