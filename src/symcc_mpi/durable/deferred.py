"""The deferred-work journal (F317 §4.2): work set aside after repeated protocol failures,
kept across a restart in `OUT/.dispatch_protocol_deferred.jsonl`, on the one journal
(`LineLog`)."""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.durable.journal import Damage, LineLog
from symcc_mpi.durable.lines import Writer

log = logging.getLogger(__name__)

DEFERRED_JOURNAL_NAME = ".dispatch_protocol_deferred.jsonl"
MAX_ID_LENGTH = 256


def _check_id(kind: str, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{kind} must be a non-empty string of at most {MAX_ID_LENGTH} characters")


class Deferral(enum.Enum):
    PERSISTED = "persisted"
    MEMORY_ONLY = "memory-only"  # the write failed: kept in memory, reported, retried later


@dataclass(frozen=True)
class DeferredWork:
    work_id: str
    source: str
    attempts: int
    at: float
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeferredStatistics:
    persisted: int
    memory_only: int
    write_failures: int
    last_error: str | None
    damage: int


class DeferredWorkJournal:
    """Work set aside after `SYMCC_DISPATCH_PROTOCOL_RETRIES` protocol failures (F317 §4.2).

    `defer` never raises on a write failure: the work is kept in memory, counted and reported
    as MEMORY_ONLY (F317: "journal 写失败则回到内存，绝不把持久化失败当成成功"). Later calls
    (`defer` of the same work again, or `retry`) try the write again. Deferring a work that is
    already persisted is a repeat and writes nothing.
    """

    def __init__(self, path: Path, *, clock: Clock = SYSTEM_CLOCK, fsync: bool = True,
                 writer: Writer | None = None, quarantine_dir: Path | None = None):
        self._clock = clock
        self._persisted: dict[str, DeferredWork] = {}
        self._memory_only: dict[str, DeferredWork] = {}
        self._write_failures = 0
        self._last_error: str | None = None
        self._log = LineLog(path, clock=clock, fsync=fsync, writer=writer,
                             quarantine_dir=quarantine_dir)
        self.damage: tuple[Damage, ...] = self._log.load(self._replay)
        try:
            self._log.open_for_append()
        except OSError as error:
            # Unwritable directory or full disk: deferring still works, in memory, and says so.
            self._fail(error)

    @property
    def path(self) -> Path:
        return self._log.path

    def defer(self, work_id: str, *, source: str, attempts: int,
              payload: Mapping[str, Any] | None = None) -> Deferral:
        _check_id("work_id", work_id)
        _check_id("source", source)
        if not isinstance(attempts, int) or attempts < 0:
            raise ValueError("attempts must be a non-negative integer")
        if work_id in self._persisted:
            return Deferral.PERSISTED
        item = self._memory_only.get(work_id) or DeferredWork(
            work_id, source, attempts, self._clock.time(), dict(payload or {}))
        return self._persist(item)

    def retry(self) -> int:
        """Try again to persist every memory-only deferral; return how many are still only in
        memory."""
        for item in list(self._memory_only.values()):
            self._persist(item)
        return len(self._memory_only)

    def _persist(self, item: DeferredWork) -> Deferral:
        record = {"event": "defer", "work": item.work_id, "source": item.source,
                  "attempts": item.attempts, "at": item.at, "payload": dict(item.payload)}
        try:
            self._log.append(record)
        except OSError as error:
            self._memory_only[item.work_id] = item
            self._fail(error)
            return Deferral.MEMORY_ONLY
        self._memory_only.pop(item.work_id, None)
        self._persisted[item.work_id] = item
        return Deferral.PERSISTED

    def _fail(self, error: OSError) -> None:
        self._write_failures += 1
        self._last_error = f"{self.path}: {error}"
        log.warning("deferred-work journal write failed, kept in memory: %s", self._last_error)

    def _replay(self, record: dict[str, Any]) -> None:
        try:
            if record["event"] != "defer":
                raise ValueError(f"unknown event {record['event']!r}")
            item = DeferredWork(record["work"], record["source"], record["attempts"],
                                record["at"], record["payload"])
            _check_id("work_id", item.work_id)
            _check_id("source", item.source)
            if not isinstance(item.attempts, int) or not isinstance(item.payload, dict):
                raise ValueError("attempts or payload has the wrong type")
        except (KeyError, TypeError) as error:
            raise ValueError(f"not a deferral: {error!r}") from None
        self._persisted.setdefault(item.work_id, item)  # the first deferral wins; repeats are
        # harmless (a retry after an ambiguous failure)

    def deferred(self) -> dict[str, DeferredWork]:
        """Every deferred work, persisted or not."""
        return {**self._memory_only, **self._persisted}

    def is_persisted(self, work_id: str) -> bool:
        return work_id in self._persisted

    def statistics(self) -> DeferredStatistics:
        return DeferredStatistics(
            persisted=len(self._persisted), memory_only=len(self._memory_only),
            write_failures=self._write_failures, last_error=self._last_error,
            damage=len(self.damage))

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> DeferredWorkJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
