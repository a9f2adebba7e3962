"""Every field of a worker's RESULT, checked before anything of it is committed (DESIGN §2).

A worker is not trusted: whatever it sends may be broken or hostile. `check_fields` is pure
(the decoded struct in, the decoded coverage summaries out; the staged pack is checked by
staging.Pack). It raises `InvalidResult` naming the field at fault; the master then refuses
the RESULT (its input back to the frontier, its staging discarded), counts it under that
field and retires a rank after `dispatch.coordinator.MAX_INVALID_RESULTS` of them in a row.
"""

from __future__ import annotations

import math

import msgspec

from symcc_mpi.coverage.edges import DEFAULT_MAP_SIZE, FileCoverage
from symcc_mpi.coverage.edges import Status as ProbeStatus
from symcc_mpi.wire.protocol import (
    MAX_GENERATED,
    PHASES,
    Result,
    ResultField,
    ResultOutcome,
    StagedFile,
    staged_entry_problem,
)

# Exit statuses are 0..255, or -signal; anything else did not come from a process.
EXIT_STATUS_RANGE = range(-255, 256)
MAX_SECONDS = 1e7  # per run, for wall and solver time: months, far past any timeout
MAX_COUNT = 1 << 62  # solver queries made or skipped in one run


class InvalidResult(Exception):
    """A RESULT field that cannot be believed; `field` says which kind."""

    def __init__(self, field: ResultField, reason: str):
        super().__init__(reason)
        self.field = field


def check_fields(result: Result, *, map_size: int | None,
                 known=lambda digest: False) -> list[FileCoverage | None]:
    """Check every field of `result`; return each staged entry's decoded coverage summary.

    `map_size`: the campaign's coverage map size (0 while no summary told it), or None when
    the campaign has no coverage map: summaries are then not used, and not decoded. Nor are
    those of the entries `known(digest)` says the campaign has already (never used either).
    """
    try:
        ResultOutcome(result.outcome)
    except ValueError:
        raise InvalidResult(ResultField.OUTCOME, f"outcome {result.outcome!r:.40}") from None
    _check_figures(result)
    staged = result.staged
    if not 0 <= result.generated <= MAX_GENERATED or len(staged) > result.generated:
        raise InvalidResult(ResultField.MANIFEST_LENGTH,
                            f"{len(staged)} staged entries for {result.generated} generated")
    coverages: list[FileCoverage | None] = [None] * len(staged)
    summarised: list[tuple[int, StagedFile, ProbeStatus]] = []  # what to decode
    names: set[str] = set()
    for position, entry in enumerate(staged):
        if problem := staged_entry_problem(entry):
            raise InvalidResult(*problem)
        if entry.digest in names:
            raise InvalidResult(ResultField.DUPLICATE, f"staged {entry.digest[:12]} listed twice")
        names.add(entry.digest)
        try:
            status = ProbeStatus(entry.status)
        except ValueError:
            raise InvalidResult(
                ResultField.STATUS,
                f"staged {entry.digest[:12]}: status {entry.status!r:.40}") from None
        if map_size is not None and entry.coverage is not None and not known(entry.digest):
            summarised.append((position, entry, status))
    if summarised:
        try:
            decoded = FileCoverage.unpack_many([entry.coverage for _, entry, _ in summarised])
        except ValueError:  # which one, and why
            decoded = [_unpacked(entry) for _, entry, _ in summarised]
        for (position, entry, status), coverage in zip(summarised, decoded, strict=True):
            coverages[position] = _fitting(entry.digest, coverage, status, map_size)
    return coverages


def _check_figures(result: Result) -> None:
    exit_status = result.exit_status
    if exit_status is not None and exit_status not in EXIT_STATUS_RANGE:
        raise InvalidResult(ResultField.FIGURES, f"exit status {exit_status}")
    for name in ("wall_time", "solver_time"):
        seconds = getattr(result, name)
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
            raise InvalidResult(ResultField.FIGURES, f"{name} {seconds!r}")
    for name, seconds in zip(PHASES, msgspec.structs.astuple(result.phases), strict=True):
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
            raise InvalidResult(ResultField.FIGURES, f"phase {name} {seconds!r}")
    for name in ("solver_queries", "queries_skipped"):
        count = getattr(result, name)
        if count is not None and not 0 <= count <= MAX_COUNT:
            raise InvalidResult(ResultField.FIGURES, f"{name} {count}")


def _unpacked(entry: StagedFile) -> FileCoverage:
    try:
        return FileCoverage.unpack(entry.coverage)
    except ValueError as error:
        raise InvalidResult(ResultField.COVERAGE,
                            f"staged {entry.digest[:12]}: {error}") from None


def _fitting(digest: str, coverage: FileCoverage, status: ProbeStatus,
             map_size: int) -> FileCoverage:
    """A valid summary that agrees with its entry's status and fits the map in use: an index
    past it would make the master grow its maps (up to 2^28 bytes each)."""
    if coverage.status is not status:
        raise InvalidResult(ResultField.STATUS, f"staged {digest[:12]}: status {status.value} "
                            f"but its coverage summary says {coverage.status.value}")
    if map_size and coverage.map_size not in (0, map_size):
        raise InvalidResult(ResultField.COVERAGE, f"staged {digest[:12]}: coverage summary "
                            f"for a map of {coverage.map_size}, the campaign's has {map_size}")
    # Neither side knows the size yet (a summary of an empty file, probed alone): AFL's own
    # default, which an honest summary exceeds only for a larger map, and only until the
    # first summary that names it.
    limit = map_size or coverage.map_size or DEFAULT_MAP_SIZE
    if coverage.top_index >= limit:
        raise InvalidResult(ResultField.COVERAGE, f"staged {digest[:12]}: coverage summary: "
                            f"a map index beyond the map size {limit}")
    return coverage
