"""The journal of a master whose whole group died (several masters under ULFM), closed by the
first master, which hands the dead master's work to the others (federation/withdrawal.py).

Nobody can take the dead master's place, so nobody redoes its journal: what it dispatched and
did not commit, a commit it left half done included, is taken back on record (one
`recovered` record, F443), and analysed again by the input's new owner. Nothing is lost: a
half-done commit's children that reached corpus/ stay there (promotion is idempotent), and
the new run of their parent finds them known. Nothing is analysed twice: the dead master wrote
no done line for what is taken back. The children its journal says it published, and the
crashes and hangs it kept, are returned for the first master to name, as a successor would
hand them (its messages may have died with it); its workers' packs are removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.campaign import wal
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.wal import Kind, kind_of, outstanding, replay_epochs
from symcc_mpi.wire.protocol import Finding


@dataclass(frozen=True)
class Settled:
    taken_back: list[str]  # the work ids (splitting.py) the dead master had out
    findings: list[Finding]  # for the first master to name


def settle_journal(out: Path, master: int, failed: list[str]) -> Settled:
    """Take master `master`'s campaign lock and close its journal as above. Raises
    CampaignError if the lock is still held (on NFS a dead client's locks outlive it
    for a while): the caller tries again later."""
    campaign = CampaignDir(out, master=master)
    campaign.lock()
    try:
        records = campaign.open_journal()  # a torn last line is cut here
        past = replay_epochs(records, epoch=campaign.epoch)
        campaign.epoch = past.epoch
        left = sorted(outstanding(past.current))
        dispatches = [r for r in past.current if kind_of(r) is Kind.DISPATCH]
        if left:
            generation = max((r.get("generation", 0) for r in dispatches), default=0)
            campaign.record_work(wal.Recovered(generation=generation, failed=failed,
                                               requeued=left, master="reclaimed"))
        campaign.clear_staging({r["token"] for r in dispatches})
        findings = campaign.findings_to_forward()
    finally:
        campaign.close()  # the group commit: the record is durable before anyone acts on it
    return Settled(left, findings)
