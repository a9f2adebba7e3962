"""What `--resume` needs besides the done journal: the QSYM pruning maps, the triage map,
and when to snapshot the master's state (snapshot.py).

Both are saved only after the round's done-journal lines are durable (group commit), so a
saved map never holds bits of a run the journal could lose: a run analysed again on resume
is then never pruned by its own first execution. The triage map records how many queue/
entries it covers; on resume only the entries after those are replayed through afl-showmap
(the ones promoted after the last save), not the whole corpus.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.coverage.pruning import MalformedDelta, PruningLedger, load_maps, save_maps
from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("symcc_mpi.campaign.checkpoint")

# The done journal is group-committed at most every SYNC_INTERVAL: the data of every file
# published since the last commit, their directories, then the journal are fsynced (on ext4
# here ~0.2 ms of master CPU with no child, ~0.7 ms with one, ~1.1 ms with four; several ms
# of wall time on a busy disk), and results arrive one or two per round. A crash loses at
# most that window of done records, never their children: those inputs are analysed again on
# --resume. Maps are saved at most every SAVE_INTERVAL, always right after a sync.
SYNC_INTERVAL = 0.2
SAVE_INTERVAL = 2.0
# A lone master snapshots its state (snapshot.py) in its first round, after each compaction
# and epoch, and otherwise every SNAPSHOT_INTERVAL or SNAPSHOT_COST_SHARE times what the last
# one took, whichever is longer: a resume after a crash replays at most that much of the
# journal, and snapshots cost the master at most 1% of its time (0.1-0.3 s at a million).
SNAPSHOT_INTERVAL = 30.0
SNAPSHOT_COST_SHARE = 100
PRUNING_DIR = "pruning"
TRIAGE_FILE = "triage.map"


class _TriageState(msgspec.Struct, array_like=True):
    version: int
    queue_entries: int  # queue/ ids below this are merged into `coverage`
    coverage: bytes  # triage.CoverageMap.to_bytes()


class Checkpointer:
    def __init__(self, campaign: CampaignDir, *, pruning: PruningLedger | None, triage,
                 importer=None, pool=None, snapshot_point=None, clock: Clock = SYSTEM_CLOCK):
        self.campaign = campaign
        self.pool = pool  # tiers.pool.AsidePool: its spent packs go after the sync
        self.importer = importer  # afl_sync.Importer of a hybrid campaign: its cursors
        self.pruning = pruning
        self.triage = triage  # triage.CoverageMap or None
        self.clock = clock
        self.next_sync = 0.0
        self.next_save = 0.0
        self.triage_dirty = False
        self.saves = 0
        # () -> the work ids in flight when a snapshot may be taken now, else None; None
        # for a master that takes none (one of several).
        self.snapshot_point = snapshot_point
        self.next_snapshot = 0.0  # due in the first round

    def after_round(self, *, final: bool = False) -> None:
        """Make the done records durable when due, then the maps when they are due."""
        now = self.clock.monotonic()
        if not final and now < self.next_sync:
            return
        self.campaign.sync_done()
        if self.campaign.compact_if_due():
            self.snapshot_due()  # the last one covers a journal that is no more
        self.next_sync = now + SYNC_INTERVAL
        if not final and self.snapshot_point is not None and now >= self.next_snapshot:
            self._snapshot(now)
        if self.pool is not None:
            self.pool.collect()
        if not final and now < self.next_save:
            return
        self.next_save = now + SAVE_INTERVAL
        if self.pruning is not None and self.pruning.dirty:
            self.save_pruning()
        if self.importer is not None:
            self.importer.save()  # the imports it counts are durable since the sync above
        if self.triage is not None and self.triage_dirty:
            state = _TriageState(1, self.campaign.queue_entries, self.triage.to_bytes())
            write_durable(self.campaign.state / TRIAGE_FILE, msgspec.msgpack.encode(state))
            self.triage_dirty = False
            self.saves += 1

    def snapshot_due(self) -> None:
        self.next_snapshot = 0.0

    def _snapshot(self, now: float) -> None:
        in_flight = self.snapshot_point()
        if in_flight is None:
            return  # not now: a later round takes it
        self.campaign.save_snapshot(in_flight)
        cost = self.clock.monotonic() - now
        self.next_snapshot = now + max(SNAPSHOT_INTERVAL, SNAPSHOT_COST_SHARE * cost)

    def save_pruning(self) -> None:
        save_maps(self.campaign.state / PRUNING_DIR, self.pruning.maps())
        self.pruning.dirty = False
        self.saves += 1


def load_pruning(campaign: CampaignDir) -> dict[str, bytes]:
    try:
        return load_maps(campaign.state / PRUNING_DIR)
    except MalformedDelta as error:
        raise CampaignError(f"corrupt state file: {error}") from None


def load_triage(campaign: CampaignDir):
    """The saved triage map and the number of queue entries it covers, or (None, 0)."""
    from symcc_mpi.coverage.triage import CoverageMap

    path: Path = campaign.state / TRIAGE_FILE
    try:
        state = msgspec.msgpack.decode(path.read_bytes(), type=_TriageState)
        if state.version != 1:
            raise ValueError(f"version {state.version}")
        return CoverageMap.from_bytes(state.coverage), state.queue_entries
    except FileNotFoundError:
        return None, 0
    except (ValueError, msgspec.DecodeError) as error:
        # The map is derived state: the corpus rebuilds it, only more slowly.
        log.warning("%s is unreadable (%s): replaying the whole queue", path, error)
        return None, 0
