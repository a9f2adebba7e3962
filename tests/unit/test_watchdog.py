"""F317: watchdog configuration, deadlines, parked ranks, exact READY recovery, retry/defer.

The three cases of F317 §5 are marked `# F317 §5.N`; the others pin the round order (W3),
the statistics (W9) and the structured log source.
"""

from __future__ import annotations

import hashlib
import logging
import math
from types import SimpleNamespace

import pytest

from symcc_mpi.config import PROTOCOL_RETRIES_ENV, WATCHDOG_ENV
from symcc_mpi.dispatch.tables import CommitStart, DispatchTables, ParkedWorker, ResultClass
from symcc_mpi.dispatch.transaction import DispatchTransaction, SendPhase
from symcc_mpi.dispatch.watchdog import (
    MAX_SECONDS,
    DispatchWatchdog,
    GateVerdict,
    ProtocolRecovery,
    ReadyVerdict,
    RecoveryAction,
    RecoverySource,
    RetiredDispatchGate,
    WatchdogConfig,
    default_watchdog_seconds,
)
from symcc_mpi.durable.clock import ManualClock

W = 100.0


def wid(i: int) -> str:
    return hashlib.sha256(f"input-{i}".encode()).hexdigest()


def tok(i: int) -> str:
    return f"{i:032x}"


class MemorySink:
    """A deferred-work journal that raises on a failed write."""

    def __init__(self):
        self.persisted: dict[str, tuple[str, int]] = {}
        self.fail = False

    def defer(self, work_id: str, *, source: str, attempts: int) -> None:
        if self.fail:
            raise OSError(5, "injected EIO")
        self.persisted.setdefault(work_id, (source, attempts))

    def is_persisted(self, work_id: str) -> bool:
        return work_id in self.persisted


class MemoryOnlySink(MemorySink):
    """Like `durable.journal.DeferredWorkJournal`: a failed write is kept, not raised."""

    def defer(self, work_id: str, *, source: str, attempts: int) -> str:
        if self.fail:
            return "memory-only"
        super().defer(work_id, source=source, attempts=attempts)
        return "persisted"


def make(*, seconds=W, retries=1, sink=None):
    clock = ManualClock()
    gate = RetiredDispatchGate()
    tables = DispatchTables(clock=clock, gate=gate)
    frontier: list[str] = []
    recovery = ProtocolRecovery(requeue=frontier.append, sink=sink, retries=retries)
    watchdog = DispatchWatchdog(tables, gate, recovery, seconds=seconds)
    return SimpleNamespace(clock=clock, gate=gate, tables=tables, frontier=frontier,
                           recovery=recovery, watchdog=watchdog)


def dispatch(w, rank: int, work: str, token: str) -> DispatchTransaction:
    tx = w.tables.begin(rank, work, token)
    w.tables.sent(rank, token)
    return tx


# -- F317 §5.1 deadlines and configuration -------------------------------------------------


def test_only_a_dispatched_active_transaction_expires_exactly_at_its_deadline():  # F317 §5.1
    clock = ManualClock()
    tables = DispatchTables(clock=clock)
    tx = tables.begin(1, wid(1), tok(1))
    clock.advance(10 * W)
    assert not tx.expired(clock.monotonic(), W)  # PREPARING never times out (W1)
    assert tables.expired(clock.monotonic(), W) == ()
    tables.sent(1, tx.token)  # the deadline counts from the send's return
    sent = clock.monotonic()
    assert tx.deadline(W) == sent + W
    clock.advance(W - 0.5)
    assert not tx.expired(clock.monotonic(), W)
    clock.advance(0.5)
    assert tx.expired(clock.monotonic(), W)  # the boundary itself is expired
    assert tables.expired(clock.monotonic(), W) == ((1, tx.token),)
    assert not tx.expired(clock.monotonic(), 0.0)  # 0 disables
    assert tables.expired(clock.monotonic(), 0.0) == ()
    tables.begin_commit(1, tx.token, lambda: True)
    assert not tx.expired(clock.monotonic(), W)  # COMMITTING never times out (W1)
    tables.finish(1, tx.token)
    assert not tx.expired(clock.monotonic() + W, W)  # closed

    other = tables.begin(2, wid(2), tok(2))
    tables.sent(2, other.token)
    clock.advance(W)
    tables.abort(2, other.token)
    assert not other.expired(clock.monotonic(), W)


@pytest.mark.parametrize(("text", "expected"), [
    (None, 120.0), ("", 120.0), ("  ", 120.0), ("0", 0.0), ("0.0", 0.0), ("90.5", 90.5),
    (" 300 ", 300.0), ("86400", 86400.0), ("86400.5", MAX_SECONDS), ("1e9", MAX_SECONDS),
    ("nan", 120.0), ("NaN", 120.0), ("inf", 120.0), ("Infinity", 120.0),
    ("-Infinity", 120.0), ("ten", 120.0), ("5s", 120.0), ("-1", 0.0), ("-0.001", 0.0),
])
def test_watchdog_seconds_parse_like_the_note_says(text, expected):  # F317 §5.1
    env = {} if text is None else {WATCHDOG_ENV: text}
    assert WatchdogConfig.from_env(env, execution_timeout=10.0).seconds == expected


def test_watchdog_default_and_config_notes():  # F317 §4.1, W9
    assert default_watchdog_seconds(10.0) == 120.0
    assert default_watchdog_seconds(60.0) == 240.0
    assert default_watchdog_seconds(1e6) == MAX_SECONDS
    assert default_watchdog_seconds(math.nan) == 120.0
    assert WatchdogConfig.from_env({WATCHDOG_ENV: "nan"}, execution_timeout=60.0).seconds == 240.0
    config = WatchdogConfig.from_env({}, execution_timeout=60.0)
    assert config == WatchdogConfig(240.0, 1, ())
    assert config.enabled
    config = WatchdogConfig.from_env({WATCHDOG_ENV: "0", PROTOCOL_RETRIES_ENV: "3"},
                                     execution_timeout=60.0)
    assert (config.seconds, config.protocol_retries, config.enabled) == (0.0, 3, False)
    assert config.notes == ()  # 0 is a valid choice, not an adjustment
    config = WatchdogConfig.from_env({WATCHDOG_ENV: "Infinity", PROTOCOL_RETRIES_ENV: "x"},
                                     execution_timeout=10.0)
    assert (config.seconds, config.protocol_retries) == (120.0, 1)
    assert len(config.notes) == 2 and "not finite" in config.notes[0]
    assert WatchdogConfig.from_env({PROTOCOL_RETRIES_ENV: "-2"},
                                   execution_timeout=10.0).protocol_retries == 0
    assert WatchdogConfig.from_env({}, execution_timeout=10.0).protocol_retries == 1


# -- F317 §5.2 parked ranks ----------------------------------------------------------------


def test_a_parked_rank_is_released_only_by_its_exact_retired_token():  # F317 §5.2
    w = make()
    tx = dispatch(w, 1, wid(1), tok(1))
    w.clock.advance(W)
    (timeout,) = w.watchdog.sweep()
    assert (timeout.rank, timeout.token, timeout.work_id) == (1, tx.token, wid(1))
    assert timeout.source is RecoverySource.WATCHDOG_TIMEOUT
    assert timeout.rollback.phase is SendPhase.AFTER_SEND
    assert w.gate.parked() == {1: tx.token}
    with pytest.raises(ParkedWorker):  # the dispatch entry refuses it (W6)
        w.tables.begin(1, wid(2), tok(2))

    assert w.watchdog.on_ready(1, None) is ReadyVerdict.PARKED
    assert w.watchdog.on_ready(1, None, malformed=True) is ReadyVerdict.PARKED
    assert w.watchdog.on_ready(1, tok(99)) is ReadyVerdict.PARKED
    assert w.gate.is_parked(1)
    assert w.watchdog.on_result(1, tx.token) is ResultClass.STALE  # its late RESULT (W8)
    assert w.tables.begin_commit(1, tx.token, lambda: True) is CommitStart.NOT_ACTIVE
    assert w.watchdog.on_ready(1, tx.token) is ReadyVerdict.RECOVERED
    assert not w.gate.is_parked(1)
    assert w.gate.admit(1, tx.token) is GateVerdict.NOT_PARKED
    stats = w.watchdog.statistics()
    assert (stats.timeouts, stats.worker_recoveries, stats.parked) == (1, 1, 0)
    assert (stats.ready_missing, stats.ready_malformed, stats.ready_stale) == (1, 1, 1)
    assert stats.stale_results == 1

    # Recovered before its old RESULT arrived: the new dispatch is not confused by it (§4.3).
    new = dispatch(w, 1, wid(2), tok(2))
    assert w.watchdog.on_result(1, tx.token) is ResultClass.STALE
    assert w.watchdog.on_result(1, new.token) is ResultClass.CURRENT


def test_a_rank_that_never_answers_stays_parked():  # F317 W10
    w = make()
    dispatch(w, 1, wid(1), tok(1))
    w.clock.advance(W)
    w.watchdog.sweep()
    for _ in range(3):
        w.clock.advance(W)
        assert w.watchdog.sweep() == ()
    assert w.gate.parked() == {1: tok(1)} and w.watchdog.statistics().timeouts == 1


def test_the_timeout_rolls_back_the_exact_generation_with_after_send_semantics():  # W4
    w = make()
    undone: list[tuple[str, str]] = []
    tx = w.tables.begin(1, wid(1), tok(1))
    for resource in ("state", "proposal"):
        tx.register(resource, before_send=lambda r=resource: undone.append((r, "before-send")),
                    after_send=lambda r=resource: undone.append((r, "after-send")))
    w.tables.sent(1, tx.token)
    w.clock.advance(W / 2)
    other = dispatch(w, 2, wid(2), tok(2))
    w.clock.advance(W / 2)
    (recovery,) = w.watchdog.sweep()  # rank 2 is not yet due
    assert recovery.token == tx.token and w.tables.find(2) is not None
    # It was sent: each reservation is discarded (after-send), in reverse order, once.
    assert undone == [("proposal", "after-send"), ("state", "after-send")]
    assert w.frontier == [wid(1)]  # the work id, never the token (W5)
    w.clock.advance(W / 2)
    assert [r.token for r in w.watchdog.sweep()] == [other.token]


def test_disabled_watchdog_never_sweeps():
    w = make(seconds=0.0)
    dispatch(w, 1, wid(1), tok(1))
    w.clock.advance(MAX_SECONDS * 10)
    assert w.watchdog.sweep() == () and not w.watchdog.statistics().enabled
    with pytest.raises(ValueError):
        make(seconds=math.inf)


# -- F317 §5.3 retry, then durable defer ---------------------------------------------------


def test_same_work_requeues_once_then_defers_and_an_eio_keeps_it_in_memory():  # F317 §5.3
    sink = MemorySink()
    w = make(sink=sink)
    dispatch(w, 1, wid(1), tok(1))
    w.clock.advance(W)
    (first,) = w.watchdog.sweep()
    assert (first.action, first.failures) == (RecoveryAction.REQUEUED, 1)
    assert w.frontier == [wid(1)] and sink.persisted == {}

    w.watchdog.on_ready(1, tok(1))  # back from park
    dispatch(w, 1, w.frontier.pop(), tok(2))  # same work, new transport token
    w.clock.advance(W)
    (second,) = w.watchdog.sweep()
    assert (second.action, second.failures) == (RecoveryAction.DEFERRED, 2)
    assert sink.persisted == {wid(1): ("watchdog-timeout", 2)}  # keyed by work id only
    assert w.frontier == []

    sink.fail = True  # the journal is unwritable: never pretend the deferral is durable
    for token in (3, 4):
        w.watchdog.on_ready(2, None)
        dispatch(w, 2, wid(2), tok(token))
        w.tables.abort(2, tok(token))  # pretend a join: use the recovery directly
        outcome = w.recovery.recover(wid(2), RecoverySource.INVALID_RESULT)
    assert outcome.action is RecoveryAction.DEFERRED_IN_MEMORY
    assert w.recovery.deferred_in_memory() == {wid(2)} and wid(2) not in sink.persisted
    assert w.frontier == [wid(2)]  # only the first (requeue) put it in the frontier
    stats = w.recovery.statistics()
    assert (stats.requeued, stats.deferred, stats.deferred_in_memory,
            stats.deferral_write_failures) == (2, 2, 1, 1)
    assert w.recovery.retry_deferrals() == 1  # still failing
    sink.fail = False
    assert w.recovery.retry_deferrals() == 0
    assert sink.persisted[wid(2)] == ("invalid-result", 2)
    assert w.recovery.deferred() == {wid(1), wid(2)}
    assert dict(stats.by_source) == {"watchdog-timeout": 2, "invalid-result": 2}


def test_a_sink_that_keeps_failed_writes_in_memory_is_not_taken_for_durable():
    sink = MemoryOnlySink()
    sink.fail = True
    recovery = ProtocolRecovery(requeue=lambda _: None, sink=sink, retries=0)
    outcome = recovery.recover(wid(1), RecoverySource.WATCHDOG_TIMEOUT)
    assert outcome.action is RecoveryAction.DEFERRED_IN_MEMORY
    sink.fail = False
    assert recovery.retry_deferrals() == 0 and sink.is_persisted(wid(1))
    no_sink = ProtocolRecovery(requeue=lambda _: None, sink=None, retries=0)
    assert no_sink.recover(wid(1), RecoverySource.WATCHDOG_TIMEOUT).action is \
        RecoveryAction.DEFERRED_IN_MEMORY
    with pytest.raises(ValueError):
        ProtocolRecovery(requeue=lambda _: None, sink=None, retries=-1)


# -- the round order (F317 §4.2, W3) -------------------------------------------------------


def test_a_ready_seen_this_round_is_joined_not_timed_out():  # W3
    w = make()
    tx = dispatch(w, 1, wid(1), tok(1))
    w.clock.advance(2 * W)
    # Step 1: READY echoes the current token (its RESULT was lost or is still in flight).
    assert w.watchdog.on_ready(1, tx.token) is ReadyVerdict.JOIN
    # A misordered sweep before the join must still leave it to the join.
    assert w.watchdog.sweep() == ()
    report = w.watchdog.join()  # step 4: the RESULT never came
    (joined,) = report.recoveries
    assert joined.source is RecoverySource.INVALID_RESULT and report.ready == (1,)
    assert w.watchdog.sweep() == ()  # step 5
    assert not w.gate.is_parked(1)
    stats = w.watchdog.statistics()
    assert (stats.timeouts, stats.invalid_joins, stats.protocol_requeued) == (0, 1, 1)


def test_a_result_drained_before_the_sweep_is_committed():  # W3
    w = make()
    tx = dispatch(w, 1, wid(1), tok(1))
    w.clock.advance(2 * W)
    assert w.watchdog.on_ready(1, tx.token) is ReadyVerdict.JOIN  # step 1
    assert w.watchdog.on_result(1, tx.token) is ResultClass.CURRENT  # step 3
    assert w.tables.begin_commit(1, tx.token, lambda: True) is CommitStart.COMMITTING
    # Still committing at the join: the READY waits, the rank is not handed out.
    assert w.watchdog.on_ready(1, tx.token) is ReadyVerdict.BUSY
    assert w.watchdog.join().ready == ()
    w.tables.finish(1, tx.token)
    report = w.watchdog.join()
    assert report.recoveries == () and report.ready == (1,)
    assert w.watchdog.sweep() == ()
    assert w.watchdog.on_ready(1, tx.token) is ReadyVerdict.IDLE


def test_a_bad_result_with_the_current_token_is_recovered_at_the_join():
    w = make()
    tx = dispatch(w, 1, wid(1), tok(1))
    assert not w.watchdog.note_invalid_result(1, tok(7))
    assert w.watchdog.note_invalid_result(1, tx.token)
    report = w.watchdog.join()
    assert [r.work_id for r in report.recoveries] == [wid(1)] and report.ready == ()
    assert w.watchdog.on_ready(1, tx.token) is ReadyVerdict.IDLE  # its READY follows


def test_ready_verdicts_of_a_rank_that_is_not_parked():
    w = make()
    assert w.watchdog.on_ready(1, None) is ReadyVerdict.IDLE
    assert w.watchdog.on_ready(1, None, malformed=True) is ReadyVerdict.MALFORMED
    tx = w.tables.begin(1, wid(1), tok(1))
    assert w.watchdog.on_ready(1, tok(0)) is ReadyVerdict.BUSY  # still preparing
    w.tables.sent(1, tx.token)
    assert w.watchdog.on_ready(1, tok(0)) is ReadyVerdict.STALE


def test_a_fault_free_run_counts_nothing(caplog):  # F317 §4.4
    w = make(sink=MemorySink())
    caplog.set_level(logging.INFO, logger="symcc_mpi.dispatch")
    for i in range(20):
        rank = 1 + i % 3
        assert w.watchdog.on_ready(rank, tok(i - 3) if i >= 3 else None) is ReadyVerdict.IDLE
        tx = dispatch(w, rank, wid(i), tok(i))
        w.clock.advance(W / 4)
        assert w.watchdog.on_result(rank, tx.token) is ResultClass.CURRENT
        w.tables.begin_commit(rank, tx.token, lambda: True)
        w.tables.finish(rank, tx.token)
        assert w.watchdog.join().recoveries == ()
        assert w.watchdog.sweep() == ()
    stats = w.watchdog.statistics()
    assert (stats.timeouts, stats.worker_recoveries, stats.protocol_requeued,
            stats.protocol_deferred) == (0, 0, 0, 0)
    assert caplog.records == []


def test_the_log_says_which_source_recovered_the_work(caplog):  # F317 §4.4
    w = make()
    caplog.set_level(logging.WARNING, logger="symcc_mpi.dispatch")
    dispatch(w, 1, wid(1), tok(1))
    tx2 = dispatch(w, 2, wid(2), tok(2))
    w.watchdog.on_ready(2, tx2.token)
    w.watchdog.join()
    w.clock.advance(W)
    w.watchdog.sweep()
    sources = [r.source for r in caplog.records if hasattr(r, "source")]
    assert sources == ["invalid-result", "watchdog-timeout"]
    assert "source=watchdog-timeout" in caplog.text and "source=invalid-result" in caplog.text


def test_the_watchdog_needs_the_gate_its_tables_consult():
    gate = RetiredDispatchGate()
    recovery = ProtocolRecovery(requeue=lambda _: None, sink=None)
    with pytest.raises(ValueError):
        DispatchWatchdog(DispatchTables(), gate, recovery, seconds=W)
