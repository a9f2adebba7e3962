"""The master's phase machine: RUNNING until a stop reason, DRAINING the results in flight,
STOPPING until every worker acknowledged STOP, DONE; and the guard around the master's writes
into OUT, which stops the campaign when the filesystem refuses them."""

from __future__ import annotations

import enum
import logging
import secrets
from collections.abc import Callable

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.stats import MasterStats
from symcc_mpi.campaign.stop import StopRequest
from symcc_mpi.config import CampaignConfig, launch_environment
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import STOP_ADVICE, STORAGE_EXIT, describe, storage_failing
from symcc_mpi.processes.started import command_time
from symcc_mpi.roles.ranks import Ranks
from symcc_mpi.wire.protocol import SHUTDOWN_GRACE, Stop, Tag

log = logging.getLogger("symcc_mpi.master")

STOP_FILE_CHECK_INTERVAL = 0.25
ABORT_SILENT = 70  # MPI_Abort's status when workers stay silent past STOP (F317 W10)


class Phase(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"  # no new dispatch; waiting for the results in flight
    STOPPING = "stopping"  # STOP sent; waiting for every worker's STOP_ACK
    DONE = "done"


class StorageGuard:
    """Around the master's own writes into OUT (commit, journals, checkpoints, reports): a
    full, over-quota or read-only filesystem stops the campaign (`refused(problem)`), as does
    an I/O error no commit handled (the device is failing: a group commit's fsync, a lease);
    anything else raises. A class, not a @contextmanager generator, since the master enters
    it several times per round."""

    def __init__(self, refused: Callable[[str], object], out):
        self.refused = refused
        self.out = out

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None or not issubclass(kind, OSError) or not storage_failing(error):
            return False
        self.refused(describe(error, self.out))
        return True


class Stopping:
    """When and how the master stops. `advance` once per sweep moves the phase on; `begin`
    stops for a reason; `for_resources` stops because OUT refuses writes."""

    def __init__(self, config: CampaignConfig, campaign: CampaignDir, ranks: Ranks,
                 dispatch: DispatchCoordinator, stats: MasterStats, checkpoint: Checkpointer,
                 guard: StorageGuard, *, federation, importer,
                 report: Callable[[bool], object],
                 withdraw: Callable[[], bool] | None = None):
        self.config = config
        self.campaign = campaign
        self.ranks = ranks
        self.dispatch = dispatch
        self.stats = stats
        self.checkpoint = checkpoint
        self.federation = federation
        self.importer = importer
        self.report = report  # report(final)
        self.withdraw = withdraw  # withdraw() from the work, with several masters: True if done
        self.guard = guard  # whose refusals come to `for_resources`
        self.phase = Phase.RUNNING
        self.requested_by_signal = False
        self.stop_taken = False  # this master read the stop request: it withdraws it at the end
        self.storage_problem = ""  # set once OUT refused a write: the campaign is stopping
        # A stop request counts only for the run it was made for (corpus.stop_request_verdict).
        self.run_id = launch_environment().run_id or secrets.token_hex(8)
        self.run_started = command_time()
        # The campaign's clock for --wall-timeout: from the run's first master on, across
        # generations and masters (F443 §4 step 8); open_master sets it from the log.
        self.budget_start = SYSTEM_CLOCK.time()
        self.drain_deadline = 0.0
        self.next_stop_file_check = 0.0
        self.ack_deadline = 0.0
        # Called before the master ends the job with MPI_Abort: under ULFM the survivors
        # would otherwise take the campaign over (job/generations.py leaves the end on record).
        self.before_abort: Callable[[int, str], object] | None = None

    def on_signal(self, signum, frame) -> None:
        self.requested_by_signal = True

    def advance(self) -> None:
        now = SYSTEM_CLOCK.monotonic()
        ranks = self.ranks
        if self.phase is Phase.RUNNING:
            reason = self.reason(now)
            if reason:
                self.begin(reason)
        if self.phase is Phase.DRAINING:
            in_flight = self.dispatch.in_flight
            if not in_flight or now >= self.drain_deadline:
                if in_flight:
                    log.warning("%d results still in flight at shutdown; their inputs stay "
                                "in the frontier for --resume", in_flight)
                self.dispatch.shutdown()
                self.phase = Phase.STOPPING
                self.send_stops()
        if self.phase is Phase.STOPPING:
            if ranks.acked.issuperset(ranks.workers):
                self.phase = Phase.DONE
            elif now >= self.ack_deadline:
                missing = sorted(set(ranks.workers) - ranks.acked)
                parked = self.dispatch.gate.parked()
                # Whatever is staged now would be refused: the work in flight was taken back,
                # and the ranks that acknowledged STOP removed their own staging.
                self.campaign.clear_staging(
                    [token for tokens in ranks.recent_work.values() for token in tokens]
                    if self.federation is not None else None)
                self.campaign.unmark_staging()
                log.error("workers %s did not acknowledge STOP within %.0f s%s; ending the "
                          "job, what was committed is kept", missing, SHUTDOWN_GRACE,
                          " (parked: silent since the watchdog took back their work)"
                          if parked.keys() & set(missing) else "")
                with self.guard:
                    self.checkpoint.after_round(final=True)
                with self.guard:
                    self.report(True)
                if self.before_abort is not None:
                    self.before_abort(ABORT_SILENT, "workers did not acknowledge STOP")
                ranks.channel.comm.Abort(ABORT_SILENT)

    def send_stops(self) -> None:
        ranks = self.ranks
        for rank in ranks.workers:
            if rank not in ranks.failed and rank not in ranks.acked:
                ranks.channel.send(rank, Tag.STOP, Stop(self.stats.stop_reason))
        self.ack_deadline = SYSTEM_CLOCK.monotonic() + SHUTDOWN_GRACE

    def reason(self, now: float) -> str:
        """Why the campaign stops now, or "" while it goes on."""
        if self.requested_by_signal:
            return "interrupted"
        federation = self.federation
        if federation is not None:
            # The frontier is exhausted when every master agrees (quiescence.py); the other
            # reasons root alone sees and relays (root alone reads the stop request).
            if federation.stop_reason:
                return federation.stop_reason
            if federation.done:
                return "frontier exhausted"
            if not federation.root:
                return ""
        if now >= self.next_stop_file_check:  # a stat per round would cost the master ~3% CPU
            self.next_stop_file_check = now + STOP_FILE_CHECK_INTERVAL
            if self._stop_requested():
                return "stop requested"
        if self.dispatch.exhausted and federation is None and self.importer is None:
            return "frontier exhausted"  # a hybrid campaign waits for the fuzzers"
        elapsed = SYSTEM_CLOCK.time() - self.budget_start
        if self.config.wall_timeout is not None and elapsed >= self.config.wall_timeout:
            return "wall-clock budget spent"
        if self.config.max_idle is not None:
            last = max(self.stats.last_find, self.stats.start_time,
                       *(f.get("last_find") or 0 for f in self.federation.figures.values())
                       if self.federation is not None else ())
            if SYSTEM_CLOCK.time() - last >= self.config.max_idle:
                return f"no new finding for {self.config.max_idle:g} s"
        return ""

    def _stop_requested(self) -> bool:
        verdict = StopRequest.NONE
        with self.guard:
            verdict = self.campaign.read_stop_request(self.run_id, self.run_started)
        if verdict is StopRequest.STALE:
            log.warning("removed %s: a stop request left by an earlier run, not this one",
                        self.campaign.stop_request)
        self.stop_taken = self.stop_taken or verdict is StopRequest.THIS_RUN
        return verdict is StopRequest.THIS_RUN

    def withdraw_request(self) -> None:
        """At the end of the run: the stop request this master took is done with (until
        then a successor, should this master die, reads it again)."""
        if self.stop_taken:
            with self.guard:
                self.campaign.withdraw_stop_request()

    def begin(self, reason: str, *, failure: bool = False) -> None:
        """`failure`: because ranks died; the campaign ends unfinished (exit status 1)."""
        log.info("stopping: %s", reason)
        if self.federation is not None and not self.federation.done:
            self.federation.stopping(reason, failure=failure)  # all stop
        self._drain(reason)

    def if_no_worker_left(self, reason: str, *, failure: bool = False) -> None:
        """With several masters this one withdraws from the work, which the others share
        (federation/withdrawal.py); alone, or if it cannot, the campaign stops."""
        if self.phase is Phase.RUNNING and self.dispatch.retired.issuperset(self.ranks.workers) \
                and not (self.withdraw is not None and self.withdraw()):
            self.begin(f"no usable worker: {reason}", failure=failure)

    def _drain(self, reason: str) -> None:
        self.stats.stop_reason = reason
        self.phase = Phase.DRAINING
        self.drain_deadline = SYSTEM_CLOCK.monotonic() + self.config.timeout + SHUTDOWN_GRACE

    def for_resources(self, problem: str) -> None:
        """OUT refuses writes: say so once, dispatch nothing more, give back every result
        still coming (no input is requeued against its retries or deferred for it) and end
        with what was committed intact. Later failures are the same fault: not said again."""
        if self.storage_problem:
            return
        self.storage_problem = problem
        log.error("%s: %s", problem, STOP_ADVICE)
        if self.phase is not Phase.RUNNING:  # not what it stopped for, but what it ended with
            self.stats.stop_reason = problem
            return
        if self.federation is not None and not self.federation.done:
            self.federation.stopping(problem)  # the others cannot go on without it
        self._drain(problem)

    def exit_status(self) -> int:
        if self.storage_problem:
            return STORAGE_EXIT
        lost = self.federation is not None and self.federation.lost
        return 1 if lost or self.stats.stop_reason.startswith("no usable worker") else 0
