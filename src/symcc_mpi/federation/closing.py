"""The masters' last meeting, with several masters: root waits for every other master's final
figures before its final report, each master says farewell once it has closed (by message,
and on record for a root that may die before it reads it), and root removes the job's lease
table once every other master is done with it (the part of `Federation`, masters.py)."""

from __future__ import annotations

import logging
import shutil

from symcc_mpi.federation.own_master import OwnMaster
from symcc_mpi.wire.protocol import Farewell, Stop, Tag
from symcc_mpi.wire.transport import RankFailure

log = logging.getLogger("symcc_mpi.federation")

FINAL_FIGURES_WAIT = 60.0  # root waits this long for the others' final figures
ANSWER_POLL = 0.5  # seconds root waits for a message before it looks at the record again


class Closing:
    """Mixed into `Federation`, whose channel, roster, record and lease table it uses."""

    def wait_for_final_figures(self, own: OwnMaster) -> None:
        """Root, before its final report: every other master's final figures, bounded."""
        deadline = self.clock.monotonic() + FINAL_FIGURES_WAIT
        missing = set(self.indices[1:]) - self.final - self.roster.dead
        while missing and self.clock.monotonic() < deadline:
            self.check_farewells(self.clock.monotonic())
            self._answer_one(own, deadline)
            missing = set(self.indices[1:]) - self.final - self.roster.dead
        if missing:
            log.warning("no final figures from master(s) %s within %g s: the summary counts "
                        "their last report", ", ".join(map(str, sorted(missing))),
                        FINAL_FIGURES_WAIT)

    def farewell(self) -> None:
        """This master closed its part: root may remove the lease table once all have. On
        record too, with its final figures: root may die before it reads the message."""
        self.leases.close()
        if not self.root:
            stop = self.stop_sent
            if stop is None and self.stop_reason and not self.done:
                # Root's STOP, obeyed: a dead root may not have put it on record (its disk
                # full, say), and its successor must stop the campaign too.
                stop = Stop(self.stop_reason, self.lost)
            self.record.farewell(
                self.index, self.last_figures.snapshot if self.last_figures is not None else {},
                (stop.reason, stop.failure) if stop else None)
            self._send(0, Tag.FAREWELL, Farewell())

    def await_farewells(self, own: OwnMaster, seconds: float) -> bool:
        """Root, after its close: every other master's farewell, bounded; True if each one
        said it or died and was not replaced (the lease table is nobody's any more)."""
        deadline = self.clock.monotonic() + seconds
        while True:
            self._succession_overdue(self.clock.monotonic())
            self.check_farewells(self.clock.monotonic())
            if not self.roster.not_done(self.indices[1:]):
                return True
            if self.clock.monotonic() >= deadline:
                log.warning("the other masters did not finish within %g s: the job's lease "
                            "table stays (the next run removes it)", seconds)
                return False
            self._answer_one(own, deadline)

    def remove_lease_directory(self) -> None:
        """Root, after the final barrier: the job's table is nobody's any more."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def _answer_one(self, own: OwnMaster, deadline: float) -> None:
        """The next message from another master, if one comes before `deadline` (or within
        ANSWER_POLL), handled; a death, noted."""
        try:
            incoming = self.channel.wait(min(deadline, self.clock.monotonic() + ANSWER_POLL))
        except RankFailure:
            self._masters_died()
            return
        if incoming is not None:
            self._on_message(own, incoming, self.clock.monotonic())
