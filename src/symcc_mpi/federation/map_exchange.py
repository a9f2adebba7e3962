"""What one master knows, the others know (issue 27 item 2): the triage and pruning maps
exchanged between the masters of one job.

Both maps only ever gain bits and merge by bitwise OR, in any order, any number of times
(triage.py, pruning.py). So each master writes its whole map, when it changed, to its own file
in the job's lease directory, `maps/master-<k>.<kind>` (one atomic rename: a reader sees the
old map or the new one, never half), and ORs into its own every map of another master that
changed since it last read it. A map lost with its writer, read late or read twice costs
nothing but time: the campaign's coverage is the union of its masters' maps, and each master
holds it within about EXCHANGE_INTERVAL of its peers. So a child another master's run
already covered is not kept again, and a branch another master's runs solved is pruned here
too.

A file that cannot be one of these maps (empty, too large, a pruning map of another size) is
counted and left alone: it never reaches a map.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.coverage.edges import MAX_MAP_SIZE
from symcc_mpi.coverage.pruning import MAP_SIZE as PRUNING_MAP_SIZE
from symcc_mpi.durable.atomic import make_directories, write_durable

log = logging.getLogger("symcc_mpi.federation")

MAPS = "maps"
EXCHANGE_INTERVAL = 0.5  # seconds between two exchanges
TRIAGE, PRUNING = "triage", "pruning"


def map_path(lease_directory: Path, master: int, kind: str) -> Path:
    return Path(lease_directory) / MAPS / f"master-{master}.{kind}"


@dataclass(frozen=True)
class ExchangeStatistics:
    published: int = 0  # own maps written
    read: int = 0  # other masters' maps read (changed since the last read)
    gained: int = 0  # of those, the ones that added bits to this master's map
    rejected: int = 0  # files that could not be a map of their kind


class MapExchange:
    """One master's side: `publish` its own map of a kind, `changed` the others' maps of that
    kind that were rewritten since the last call."""

    def __init__(self, lease_directory: Path, index: int, peers: Sequence[int]):
        self.lease_directory = Path(lease_directory)
        self.index = index
        self.peers = tuple(peers)
        self._published: dict[str, bytes] = {}
        self._seen: dict[Path, tuple[int, int, int]] = {}  # inode, size, mtime of the last read
        self._published_maps = self._read = self._gained = self._rejected = 0

    def statistics(self) -> ExchangeStatistics:
        return ExchangeStatistics(self._published_maps, self._read, self._gained,
                                  self._rejected)

    def publish(self, kind: str, data: bytes) -> None:
        """This master's map of `kind`, written if it changed since the last time."""
        if self._published.get(kind) == data:
            return
        path = map_path(self.lease_directory, self.index, kind)
        make_directories(path.parent)
        write_durable(path, data, fsync=False)
        self._published[kind] = data
        self._published_maps += 1

    def changed(self, kind: str, sizes: range) -> list[bytes]:
        """The other masters' maps of `kind` rewritten since the last call whose size is in
        `sizes` (the others are counted and skipped)."""
        maps = []
        for peer in self.peers:
            path = map_path(self.lease_directory, peer, kind)
            try:
                with open(path, "rb") as handle:
                    status = os.fstat(handle.fileno())
                    key = (status.st_ino, status.st_size, status.st_mtime_ns)
                    if self._seen.get(path) == key:
                        continue
                    self._seen[path] = key
                    if status.st_size not in sizes:
                        self._reject(path, f"{status.st_size} bytes")
                        continue
                    maps.append(handle.read())
            except FileNotFoundError:
                continue  # that master has published nothing yet
            self._read += 1
        return maps

    def exchange(self, checkpoint: Checkpointer) -> None:
        """The others' triage and pruning maps ORed into this master's (`checkpoint`'s),
        then its own published for them."""
        if (triage := checkpoint.triage) is not None:
            for seen in self.changed(TRIAGE, range(1, MAX_MAP_SIZE + 1)):
                if triage.absorb(seen):
                    self._gained += 1
                    checkpoint.triage_dirty = True
            self.publish(TRIAGE, triage.seen_bytes())
        if (pruning := checkpoint.pruning) is not None:
            for whole in self.changed(PRUNING, range(PRUNING_MAP_SIZE, PRUNING_MAP_SIZE + 1)):
                if pruning.absorb(whole):
                    self._gained += 1
            if (shared := pruning.shared_map()) is not None:
                self.publish(PRUNING, shared)

    def _reject(self, path: Path, why: str) -> None:
        log.warning("%s is not a map this master can merge (%s): ignored", path, why)
        self._rejected += 1
