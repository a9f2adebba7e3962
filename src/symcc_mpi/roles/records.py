"""The master's records of F443's write-ahead log, in the done journal (corpus.record_work):
every dispatch before it leaves, every requeue, every commit's manifest before it publishes,
every recovery. Only under ULFM (`enabled`): a lone run's --resume needs none of them."""

from __future__ import annotations

from symcc_mpi.campaign import wal
from symcc_mpi.campaign.commit import Accepted, encode_manifest
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.durable.storage import storage_failing
from symcc_mpi.roles.stopping import StorageGuard
from symcc_mpi.scheduling.splitting import parse_work_id
from symcc_mpi.wire.protocol import Result, Work


class DispatchNotRecorded(OSError):
    """OUT refused the record a dispatch needs before it leaves: the campaign stops (no
    worker is blamed for it, as for a send that failed)."""

    storage_refused = True

    def __init__(self, error: OSError):
        super().__init__(error.errno, error.strerror, error.filename)


class WorkRecords:
    def __init__(self, campaign: CampaignDir, guard: StorageGuard, *, enabled: bool):
        self.campaign = campaign
        self.guard = guard  # a refused requeue or recovery record stops the campaign
        self.enabled = enabled

    def dispatch(self, work: Work, work_id: str | None, rank: int) -> None:
        """F443 §3 step 3: the dispatch is on record before it leaves."""
        if not self.enabled:
            return
        try:
            self.campaign.record_work(wal.Dispatch(
                digest=work.digest, token=work.token, generation=work.generation,
                rank=rank, part=parse_work_id(work_id)[1]))
        except OSError as error:
            if storage_failing(error):
                raise DispatchNotRecorded(error) from error  # not the worker's failure
            raise

    def requeue(self, work_id: str, why: str) -> None:
        """Every dispatch after an input's first is declared (the dispatch coordinator's
        `on_requeue`)."""
        if self.enabled:
            digest, part = parse_work_id(work_id)
            with self.guard:
                self.campaign.record_work(wal.Requeue(digest=digest, reason=why, part=part))

    def commit(self, result: Result, accepted: Accepted, rank: int, part: int | None) -> None:
        """F443 §3 step 6: the manifest, before the commit publishes anything."""
        if self.enabled:
            self.campaign.record_work(wal.Commit(
                digest=result.digest, token=result.token, generation=result.generation,
                rank=rank, part=part, **encode_manifest(result, accepted)))

    def recovered(self, generation: int, failed: list[str], requeued: list[str], master: str,
                  seconds: float) -> None:
        with self.guard:
            self.campaign.record_work(wal.Recovered(generation=generation, failed=failed,
                                                    requeued=requeued, master=master,
                                                    seconds=round(seconds, 3)))
