"""A hostile worker (DESIGN §2, issue 9): each kind of field it can spoil in a RESULT, sent by
a real rank under real mpiexec; the master refuses it, requeues its input, counts it under
its field, and the campaign ends complete with nothing of it in the corpus."""

from __future__ import annotations

import os

import pytest
from harness import assert_oracles, crash_files, explore, stats

from symcc_mpi.roles.faults import HOSTILE_FIELDS, HOSTILE_MARK

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

# Fields the schema refuses: the RESULT does not decode, so its READY's join recovers it.
UNDECODABLE = {"outcome", "status", "size", "name", "targets"}


def hostile_campaign(build, out, faults: str, *extra, seeds=None):
    environment = dict(os.environ, SYMCC_MPI_FAULTS=faults)
    process = explore(out, "--target", f"{build / 'magic'} @@", "--seeds",
                      seeds or build.parent / "seeds" / "magic", "--workers", 2,
                      "--timeout", 20, *extra, env=environment)
    assert_oracles(out, process)
    for directory in ("corpus", "queue", "crashes", "hangs"):
        for path in (out / directory).iterdir():
            assert HOSTILE_MARK not in path.read_bytes(), f"{directory}/{path.name}"
    return stats(out), process


@pytest.mark.parametrize("field", HOSTILE_FIELDS)
def test_a_hostile_field_is_refused_and_the_campaign_completes(build, tmp_path, field):
    triage = ("--afl-target", f"{build / 'magic.afl'} @@") if field == "coverage" else ()
    figures, process = hostile_campaign(build, tmp_path / "out", f"1:hostile@1={field}",
                                        *triage)
    extra = figures["extra"]
    assert extra["invalid_results"] == {field: 1}
    assert extra["stop_reason"] == "frontier exhausted"
    dispatch = extra["dispatch"]
    assert dispatch["protocol_requeued"] == 1 and dispatch["protocol_deferred"] == 0
    assert dispatch["invalid_results"] == (0 if field in UNDECODABLE else 1)
    assert dispatch["retired"] == []
    assert crash_files(tmp_path / "out"), "the planted bug was not found"
    warnings = [line for line in process.stdout.splitlines()
                if "invalid RESULT from rank 1" in line]
    assert len(warnings) == 1 and f"field {field}:" in warnings[0], warnings


def test_a_rank_hostile_three_times_in_a_row_is_retired_and_the_other_finishes(build,
                                                                               tmp_path):
    out = tmp_path / "out"
    # Rank 1 needs 4 dispatches: 9 seeds give it work whatever inputs the solver finds in
    # time on a loaded machine (seen: a one-seed campaign over after 3 executions).
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    magic = next((build.parent / "seeds" / "magic").iterdir()).read_bytes()
    for number in range(9):
        (seeds / f"seed{number}").write_bytes(magic + bytes([number]) * number)
    faults = "1:hostile@2=missing-file,1:hostile@3=figures,1:hostile@4=status"
    figures, process = hostile_campaign(build, out, faults, seeds=seeds)
    extra = figures["extra"]
    assert extra["invalid_results"] == {"missing-file": 1, "figures": 1, "status": 1}
    assert extra["dispatch"]["retired"] == [1]
    assert extra["dispatch"]["retired_for_invalid_results"] == [1]
    assert extra["stop_reason"] == "frontier exhausted"
    assert "rank 1 gets no more work: 3 invalid results in a row" in process.stdout
    assert figures["per_worker"]["1"]["executions"] == 1  # its one honest RESULT
    assert figures["per_worker"]["2"]["executions"] == figures["executions"] - 1
