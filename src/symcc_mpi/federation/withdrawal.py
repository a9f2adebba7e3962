"""A master left with no worker, with several masters: it withdraws from the work, its share
goes to the masters still working, and the campaign goes on (the part of `Federation`,
masters.py, that does it).

Its workers died, or a worker alone in its group took its dead master's place
(job/federated.py) and has nobody to run its inputs. Which master analyses an input is
rendezvous hashing over the masters that work (ownership.py): removing one moves only its own
inputs, each to one of the others. The lease table's shards do not move (a digest's shard is
its owner among all the job's masters, `owner_of`), so an input's lease lives in one shard
whoever claims it, and of two claims of it one loses.

The withdrawing master, in this order:
1. makes its journal durable (roles/master.py): once it has withdrawn, nobody redoes it, and
   its completed leases tell the others its inputs are done;
2. forgets the inputs it was splitting (`--split`): each goes whole to its new owner, to be
   split anew there, as `--resume` splits anew an input a run left half done (what its
   committed parts published stays; their branches are solved again);
3. gives up every lease it holds (with no worker none is committing) and writes the
   completions it had kept for its shard's next write;
4. puts `withdrawn-K` in the job's lease directory, durably;
5. empties its frontier and stays in the federation holding no work: it votes idle, sends its
   figures and, if it is root, remains the campaign's AFL face and the quiescence coordinator.
The others read the record as they discover work, every WITHDRAWAL_CHECK seconds while not
frozen, and at each rescan before a vote, so that a share not yet taken makes the vote BUSY
(a message could go to a dead master's place before its successor took it; a successor reads
the record at its first look). Each marks done what the other masters' journals hold, and
takes from corpus/ the withdrawn master's inputs that are now its own. A withdrawn master
that dies later held nothing: its group is gone, and nobody waits for it
(`Coordinator.leave`).

It does not withdraw, and the campaign stops for `--resume` as before, if it is the last
master that works.

A master that died with every rank of its group before it withdrew (a node lost whole) has no
successor: root withdraws it in its place (`reclaim`). It closes the dead master's journal
(campaign/dead_group.py: what was out is taken back on record, its finds are named), gives up
its leases in the table (`release`: ULFM saw its whole group die, so no token of its can be
presented again; a `committing` one too, its commit being taken back), then writes
`withdrawn-K`, and the share goes out as above. The first master's group gone whole still
stops the campaign: nobody would decide its end.
"""

from __future__ import annotations

import logging
import os
import re

from symcc_mpi.campaign.dead_group import settle_journal
from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.campaign.wal import CorruptJournal
from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.federation.own_master import OwnMaster
from symcc_mpi.federation.ownership import owner_among, owner_name
from symcc_mpi.wire.protocol import SHA256_PATTERN

log = logging.getLogger("symcc_mpi.federation")

WITHDRAWAL_CHECK = 1.0  # seconds between two looks for the masters that withdrew
RECLAIM_LOCK_WAIT = 120.0  # NFS keeps a dead client's locks until its lease expires (~90 s)
WITHDRAWN = re.compile(r"withdrawn-([0-9]+)")


class Withdrawal:
    """Mixed into `Federation`, whose ownership, leases and frontier it changes."""

    def withdraw(self, own: OwnMaster) -> bool:
        """This master has no worker left, so nothing in flight (its recovery, or its
        takeover, took that back): True if it withdrew from the work, False if it cannot (it
        is the last master that works) and the campaign must stop."""
        if not set(self.working) - self._withdrawals_on_record() - {self.index}:
            return False
        split = self.leave_the_work(own)
        log.warning("master %d has no worker left: it withdraws from the work, which %s%s",
                    self.index, self._who_shares(),
                    f" ({len(split)} inputs it was splitting go whole, split anew)"
                    if split else "")
        return True

    def leave_the_work(self, own: OwnMaster) -> list[str]:
        """Steps 2-5 above (its journal durable already); the inputs it was splitting."""
        split = own.give_up_splits()
        for digest in list(self.held):
            self.abandon(digest)
        self.leases.flush()
        write_durable(self.directory / f"withdrawn-{self.index}", b"")
        self._stop_working(self.index)
        while own.frontier:
            own.frontier.take()
        return split

    @property
    def at_work(self) -> bool:
        return self.index not in self.withdrawn

    def check_withdrawals(self, own: OwnMaster, now: float, *, rescan: bool = False) -> None:
        """Now and then, as discovery does (not while frozen), and at each rescan (F320 §2.5
        step 3: a share not yet taken is work, and the vote says so): the masters that
        withdrew since the last look."""
        if rescan or now >= self.next_withdrawal_check and not self.participant.frozen:
            self.next_withdrawal_check = now + WITHDRAWAL_CHECK
            self._take_withdrawals(own, self._withdrawals_on_record())

    def _withdrawals_on_record(self) -> set[int]:
        found = set()
        for name in os.listdir(self.directory):
            if (match := WITHDRAWN.fullmatch(name)) and int(match[1]) < self.masters:
                found.add(int(match[1]))
        return found

    def _take_withdrawals(self, own: OwnMaster, found: set[int]) -> None:
        """The inputs of the masters in `found` that withdrew since the last look and that
        this master owns now join its frontier (those no journal holds as done)."""
        news = found - self.withdrawn
        if not news:
            return
        owned_before = self.work_owner_of
        for index in sorted(news):
            self._stop_working(index)
            log.warning("master %d withdrew from the work: %s it", index, self._who_shares())
        if not self.at_work:
            return
        done = own.campaign.done_elsewhere()
        taken = self._take_back_lost(own, done)
        with os.scandir(own.campaign.corpus) as entries:
            for entry in entries:
                digest = entry.name
                if SHA256_PATTERN.match(digest) and digest not in done \
                        and owned_before(digest) in news and self.owns(digest) \
                        and digest not in own.frontier.done:
                    if not own.frontier.add(digest):
                        own.frontier.requeue(digest)  # known, not queued: another's till now
                    taken += 1
        log.warning("master %d takes %d inputs of the withdrawn", self.index, taken)

    def _take_back_lost(self, own: OwnMaster, done: set[str]) -> int:
        """This master's inputs whose lease another took over (`lost_leases`) and gave up
        when it left the work (its leases abandoned or released, none left on record):
        analysed here after all. How many."""
        back = 0
        for digest in sorted(self.lost_leases):
            if digest in done or digest in own.frontier.done:
                self.lost_leases.discard(digest)
            elif self.owns(digest) and self.leases.read(digest) is None:
                self.lost_leases.discard(digest)
                own.frontier.requeue(digest)
                back += 1
        return back

    def _who_shares(self) -> str:
        many = len(self.working) > 1
        return f"master{'s' if many else ''} {', '.join(map(str, self.working))} " \
               f"share{'' if many else 's'}"

    def _stop_working(self, index: int) -> None:
        self.withdrawn.add(index)
        self.working = tuple(k for k in self.working if k != index)
        self.work_owner_of = owner_among(self.working)

    def _withdrawn_died(self, index: int) -> bool:
        """Master `index` died with no rank of its group left: no loss if it had withdrawn
        (on record; the next look hands its share out, if this one has not yet), and root
        stops waiting for it."""
        if index == 0 or index not in self.withdrawn | self._withdrawals_on_record():
            return False  # root's group gone: nobody decides the end
        log.warning("master %d died: it had withdrawn from the work, and held none", index)
        self._leave(index, [f"rank {self.roster.world_of[index]}"], 0, "withdrawn",
                    self.clock.time())
        return True

    def reclaim(self, own: OwnMaster, now: float) -> None:
        """Root: withdraw in their place the masters whose group died whole before they
        withdrew (`Succession._group_gone`), as the module says. A dead master's lock still
        held (NFS) is tried again each round, up to RECLAIM_LOCK_WAIT; a campaign with no
        other master at work, or a journal that cannot be read, stops for `--resume`."""
        for index, (deadline, detected) in sorted(self.reclaiming.items()):
            failed = [f"rank {rank}" for rank in self.world_ranks[index]]
            if not set(self.working) - self._withdrawals_on_record() - {index}:
                settled, problem = None, "no other master works"
            else:
                try:
                    settled, problem = settle_journal(own.campaign.out, index, failed), ""
                except CorruptJournal as error:
                    settled, problem = None, str(error)
                except CampaignError as error:  # its lock, still held
                    if now < deadline:
                        continue
                    settled, problem = None, str(error)
            del self.reclaiming[index]
            if settled is None:
                log.error("master %d died with every rank of its group: %s", index, problem)
                self._lose(f"master {index} died and no worker of its is left: continue "
                           "with --resume")
                continue
            for finding in settled.findings:
                self.name_finding(own.campaign, finding)
            released = self.leases.release(owner_name(self.epoch, index),
                                           _done_anywhere(own))
            write_durable(self.directory / f"withdrawn-{index}", b"")
            log.warning("master %d died with every rank of its group: its %d dispatches out "
                        "taken back, %d leases given up; it is withdrawn from the work",
                        index, len(settled.taken_back), released)
            self._leave(index, failed, len(settled.taken_back), "reclaimed", detected)
            self.awaiting_dispatch.append(self.roster.successions[-1])
            self._take_withdrawals(own, {index})

    def _leave(self, index: int, failed: list[str], requeued: int, how: str,
               detected: float) -> None:
        """Master `index` is gone and holds no work: nobody waits for it, and root's failure
        lines say how it went (job/live.py)."""
        self.roster.awaiting.pop(index, None)
        if self.coordinator is not None:
            self.coordinator.leave(index)
            self.roster.successions.append({
                "generation": None, "failed": failed, "requeued": requeued, "master": how,
                "shrinks": 0, "recovery_seconds": 0.0, "detected": detected,
                "first_dispatch": None, "master_index": index})


def _done_anywhere(own: OwnMaster):
    """Whether a journal, the dead master's included, holds an input as done."""
    elsewhere = own.campaign.done_elsewhere()
    return lambda digest: digest in elsewhere or digest in own.frontier.done
