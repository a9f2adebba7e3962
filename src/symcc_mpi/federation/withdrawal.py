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
2. gives up every lease it holds (with no worker none is committing) and writes the
   completions it had kept for its shard's next write;
3. puts `withdrawn-K` in the job's lease directory, durably;
4. empties its frontier and stays in the federation holding no work: it votes idle, sends its
   figures and, if it is root, remains the campaign's AFL face and the quiescence coordinator.
The others read the record as they discover work, every WITHDRAWAL_CHECK seconds while not
frozen, and at each rescan before a vote, so that a share not yet taken makes the vote BUSY
(a message could go to a dead master's place before its successor took it; a successor reads
the record at its first look). Each marks done what the other masters' journals hold, and
takes from corpus/ the withdrawn master's inputs that are now its own. A withdrawn master
that dies later held nothing: its group is gone, and nobody waits for it
(`Coordinator.leave`).

It does not withdraw, and the campaign stops for `--resume` as before, if it is the last
master that works, or if parts of a split input of its are still to run (their commits are in
its journal alone).
"""

from __future__ import annotations

import logging
import os
import re

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.federation.own_master import OwnMaster
from symcc_mpi.federation.ownership import owner_among
from symcc_mpi.wire.protocol import SHA256_PATTERN

log = logging.getLogger("symcc_mpi.federation")

WITHDRAWAL_CHECK = 1.0  # seconds between two looks for the masters that withdrew
WITHDRAWN = re.compile(r"withdrawn-([0-9]+)")


class Withdrawal:
    """Mixed into `Federation`, whose ownership, leases and frontier it changes."""

    def withdraw(self, own: OwnMaster) -> bool:
        """This master has no worker left: True if it withdrew from the work, False if it
        cannot and the campaign must stop."""
        if not set(self.working) - self._withdrawals_on_record() - {self.index} or own.busy():
            return False
        for digest in list(self.held):
            self.abandon(digest)
        self.leases.flush()
        write_durable(self.directory / f"withdrawn-{self.index}", b"")
        self._stop_working(self.index)
        while own.frontier:
            own.frontier.take()
        log.warning("master %d has no worker left: it withdraws from the work, which %s",
                    self.index, self._who_shares())
        return True

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
        taken = 0
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
        self.roster.awaiting.pop(index, None)
        if self.coordinator is not None:
            self.coordinator.leave(index)
            self.roster.successions.append({
                "generation": None, "failed": [f"rank {self.roster.world_of[index]}"],
                "requeued": 0, "master": "withdrawn", "shrinks": 0, "recovery_seconds": 0.0,
                "detected": self.clock.time(), "first_dispatch": None,
                "master_index": index})
        return True
