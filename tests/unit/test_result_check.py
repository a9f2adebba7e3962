"""Every field of a worker's RESULT is checked before a commit (result_check.py): one test per
kind of field it can spoil, each naming that field; an honest RESULT passes untouched."""

from __future__ import annotations

import msgspec
import pytest

from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.campaign.result_check import InvalidResult, check_fields
from symcc_mpi.coverage.edges import FileCoverage, Status, pack_u32
from symcc_mpi.wire.protocol import (
    MAX_GENERATED,
    MAX_STAGED_SIZE,
    MalformedMessage,
    Result,
    ResultField,
    StagedFile,
    Tag,
    TaskPhases,
    decode,
    encode,
)

H = "ab" * 32
TOKEN = "0123456789abcdef" * 2
MAP = 1 << 16
CHILD = sha256_bytes(b"child")


def result(staged=(), **fields) -> Result:
    values = dict(token=TOKEN, digest=H, outcome="ok", exit_status=0, wall_time=0.5,
                  solver_time=0.1, staged=list(staged), generated=len(staged))
    values.update(fields)
    return Result(**values)


def summary(pairs=((1, 1),), status=Status.OK, map_size=MAP) -> bytes:
    return FileCoverage.from_pairs(pairs, status, map_size).pack()


def refused(field: ResultField, res: Result, map_size: int | None = MAP) -> None:
    with pytest.raises(InvalidResult) as raised:
        check_fields(res, map_size=map_size)
    assert raised.value.field is field, raised.value


def undecodable(field: ResultField, payload: bytes) -> None:
    with pytest.raises(MalformedMessage) as raised:
        decode(Tag.RESULT, payload)
    assert raised.value.field is field, raised.value


def raw(res: Result, **changes) -> bytes:
    message = msgspec.to_builtins(res, builtin_types=(bytes,))
    message.update(changes)
    return msgspec.msgpack.encode(message)


def test_an_honest_result_passes_with_its_summaries_decoded():
    entry = StagedFile(CHILD, 5, summary(), Status.OK)
    assert check_fields(result([entry]), map_size=MAP) == [FileCoverage.unpack(summary())]
    assert check_fields(result([entry]), map_size=None) == [None]  # no map: not decoded


def test_outcome_outside_the_closed_set():
    refused(ResultField.OUTCOME, result(outcome="pwned"))
    undecodable(ResultField.OUTCOME, raw(result(), outcome="pwned"))


def test_status_outside_the_closed_set_or_against_its_summary():
    refused(ResultField.STATUS, result([StagedFile(CHILD, 5, None, "pwned")]))
    entry = msgspec.to_builtins(StagedFile(CHILD, 5), builtin_types=(bytes,))
    undecodable(ResultField.STATUS, raw(result(), staged=[{**entry, "status": "pwned"}],
                                        generated=1))
    crash_summary = summary(status=Status.CRASH)
    refused(ResultField.STATUS, result([StagedFile(CHILD, 5, crash_summary, Status.OK)]))


@pytest.mark.parametrize("blob", [
    b"\xc1 not msgpack",
    FileCoverage(Status.OK, edges=b"\x01\x00\x00", buckets=b"\x01").pack(),
    summary([(MAP, 1)]),  # one past the map in use
    summary([(5, 1)], map_size=1 << 20),  # another map than the campaign's
    FileCoverage(Status.OK, edges=pack_u32([7, 3]), buckets=b"\x01\x01").pack(),  # unordered
])
def test_coverage_that_does_not_unpack_or_fit_the_map_in_use(blob):
    refused(ResultField.COVERAGE, result([StagedFile(CHILD, 5, blob)]))


def test_coverage_past_the_default_map_while_no_size_is_known():
    refused(ResultField.COVERAGE, result([StagedFile(CHILD, 5, summary([(MAP, 1)], map_size=0))]),
            map_size=0)


def test_manifest_longer_than_generated_or_past_the_bound():
    refused(ResultField.MANIFEST_LENGTH, result([StagedFile(CHILD, 5)], generated=0))
    refused(ResultField.MANIFEST_LENGTH, result(generated=MAX_GENERATED + 1))
    refused(ResultField.MANIFEST_LENGTH, result(generated=-1))


@pytest.mark.parametrize("size", [-1, MAX_STAGED_SIZE + 1])
def test_size_out_of_range(size):
    refused(ResultField.SIZE, result([StagedFile(CHILD, size)]))
    undecodable(ResultField.SIZE, encode(result([StagedFile(CHILD, size)])))


@pytest.mark.parametrize("name", [CHILD.upper(), "../corpus/" + CHILD[10:], CHILD[:-1], ""])
def test_name_not_a_lowercase_sha256(name):
    refused(ResultField.NAME, result([StagedFile(name, 5)]))
    undecodable(ResultField.NAME, encode(result([StagedFile(name, 5)])))


def test_duplicate_entries():
    refused(ResultField.DUPLICATE, result([StagedFile(CHILD, 5), StagedFile(CHILD, 5)]))


@pytest.mark.parametrize("changes", [
    {"exit_status": 1 << 40}, {"wall_time": -1.0}, {"solver_time": float("nan")},
    {"wall_time": float("inf")}, {"solver_queries": -3}, {"queries_skipped": -1},
])
def test_figures_out_of_range(changes):
    refused(ResultField.FIGURES, result(**changes))


def test_phase_times_that_cannot_be_believed_are_refused():
    check_fields(result(phases=TaskPhases(target=0.02, probe=0.001)), map_size=MAP)
    for bad in (-1.0, float("nan"), float("inf"), 1e9):
        refused(ResultField.FIGURES, result(phases=TaskPhases(staging=bad)))
