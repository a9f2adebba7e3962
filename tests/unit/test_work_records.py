"""The work records of a fault-tolerant campaign (corpus.py) and the oracles over them
(verify.py), the commit manifest (commit.py), and the capability decision (ulfm/)."""

from __future__ import annotations

import base64

import msgspec
import pytest

from symcc_mpi.campaign.commit import Accepted, Child, decode_manifest, encode_manifest
from symcc_mpi.campaign.verify import _check_work
from symcc_mpi.campaign.wal import committed_parts, outstanding
from symcc_mpi.durable.storage import STORAGE_EXIT
from symcc_mpi.ulfm import capability
from symcc_mpi.wire.protocol import MalformedMessage, Result, StagedFile

A, B, C = "a" * 64, "b" * 64, "c" * 64


def dispatch(digest, generation=0):
    return {"kind": "dispatch", "digest": digest, "token": "t" * 32, "generation": generation}


def done(digest, published=()):
    return {"digest": digest, "token": "t" * 32, "outcome": "ok", "time": 1.0,
            "published": list(published)}


def test_an_input_dispatched_is_outstanding_until_done_or_taken_back():
    assert outstanding([dispatch(A), dispatch(B)]) == {A, B}
    assert outstanding([dispatch(A), done(A)]) == set()
    assert outstanding([dispatch(A), {"kind": "requeue", "digest": A, "reason": "x"}]) == set()
    recovered = {"kind": "recovered", "generation": 1, "failed": [], "requeued": [A]}
    assert outstanding([dispatch(A), dispatch(B), recovered]) == {B}
    assert outstanding([dispatch(A), done(A), dispatch(A)]) == {A}


def part(digest, number):
    return {"kind": "part", "digest": digest, "part": number, "token": "t" * 32,
            "outcome": "ok", "published": []}


def test_the_parts_a_resume_splits_anew_are_those_committed_and_not_taken_back_since():
    requeue = {"kind": "requeue", "digest": A, "part": 1, "reason": "its input is split anew"}
    assert committed_parts([part(A, 0), part(A, 1), part(B, 0)]) == {f"{A}#0", f"{A}#1",
                                                                     f"{B}#0"}
    # A's input set aside: its part 1 declared taken back then; its trace not.
    assert committed_parts([part(A, 0), part(A, 1), requeue]) == {f"{A}#0"}
    # Split anew, part 1 committed again: taken back again at the next resume.
    assert committed_parts([part(A, 1), requeue, part(A, 1)]) == {f"{A}#1"}
    assert committed_parts([part(A, 0), part(B, 0), done(A)]) == {f"{B}#0"}


def test_a_second_dispatch_needs_a_declared_take_back_of_the_first():
    problems, facts = _check_work([dispatch(A), dispatch(A), done(A)], {A}, {})
    assert problems == [f"1 inputs were dispatched again with no recovery of their earlier "
                        f"dispatch on record, e.g. {A}"]
    recovered = {"kind": "recovered", "generation": 1, "failed": ["x"], "requeued": [A]}
    problems, facts = _check_work([dispatch(A), recovered, dispatch(A, 1), done(A)], {A}, {})
    assert problems == []
    assert facts["dispatched again (declared)"] == 1 and facts["in flight at failures"] == 1


def test_a_published_child_missing_from_the_corpus_is_a_problem():
    problems, _ = _check_work([dispatch(A), done(A, published=[B, C])], {A, B}, {})
    assert problems == [f"1 children published by committed results are missing from "
                        f"corpus/, e.g. {C}"]


def test_work_still_out_at_a_clean_end_is_a_problem_but_not_while_running():
    records = [dispatch(A), dispatch(B), done(A)]
    assert _check_work(records, {A, B}, {"phase": "running"})[0] == []
    problems, facts = _check_work(records, {A, B}, {"phase": "done"})
    assert problems == [f"1 dispatches were neither committed nor taken back at the end, "
                        f"e.g. {B}"]
    assert facts["out at the end"] == 1
    # Stopped by a full filesystem: what became of B could not be written; --resume redoes it.
    stopped = {"phase": "done", "exit_status": STORAGE_EXIT}
    assert _check_work(records, {A, B}, stopped) == ([], facts)


def test_a_manifest_holds_what_the_commit_publishes_and_decodes_back():
    crash = "d" * 64
    staged = [StagedFile(B, 3, coverage=b"\x01"), StagedFile(C, 4, coverage=b"\x02"),
              StagedFile(crash, 5, status="crash")]
    result = Result(token="f" * 32, digest=A, outcome="ok", exit_status=0, wall_time=1.0,
                    solver_time=0.5, staged=staged, generated=9, generation=3,
                    pruning=b"bits a redo does without", message="not kept",
                    path_targets=list(range(1000)))  # a long path: not journaled either
    children = [Child(staged[0], None, False), Child(staged[1], None, True),
                Child(staged[2], None, True)]
    accepted = Accepted(children, None, {}, keep=frozenset({C}))
    fields = encode_manifest(result, accepted)
    assert fields == {"outcome": "ok", "exit_status": 0,
                      "publish": [[C, 4, "ok"], [crash, 5, "crash"]]}
    record = {"kind": "commit", "digest": A, "token": "f" * 32, "generation": 3, **fields}
    decoded = decode_manifest(record)
    assert [(s.digest, s.size, s.status.value, s.coverage) for s in decoded.staged] == \
        [(C, 4, "ok", None), (crash, 5, "crash", None)]
    assert (decoded.digest, decoded.token, decoded.generation) == (A, "f" * 32, 3)
    assert decoded.pruning == b"" and decoded.generated == 2
    with pytest.raises(MalformedMessage):
        decode_manifest({**record, "publish": [[C, "four", "ok"]]})
    with pytest.raises(MalformedMessage):
        decode_manifest({**record, "outcome": "pwned"})
    with pytest.raises(MalformedMessage):
        decode_manifest({k: v for k, v in record.items() if k != "token"})
    with pytest.raises(MalformedMessage):  # an earlier version's whole RESULT, damaged
        decode_manifest({**record, "result": "not base64!"})


def test_an_earlier_versions_whole_result_decodes_with_todays_names():
    """Versions before the manifest journaled the whole RESULT, and before the digest naming
    called the input's digest `input_hash` and a staged file's `sha256`."""
    old = {"token": "f" * 32, "input_hash": A, "outcome": "ok", "exit_status": 0,
           "wall_time": 1.0, "solver_time": 0.5, "generated": 1, "generation": 2,
           "staged": [{"sha256": B, "size": 3, "status": "ok"}]}
    record = {"kind": "commit", "digest": A, "token": "f" * 32, "generation": 2,
              "result": base64.b64encode(msgspec.msgpack.encode(old)).decode()}
    decoded = decode_manifest(record)
    assert (decoded.digest, decoded.generation) == (A, 2)
    assert [(s.digest, s.size) for s in decoded.staged] == [(B, 3)]
    old["staged"][0]["sha256"] = "../etc/passwd"  # renamed, then checked as strictly as ever
    with pytest.raises(MalformedMessage):
        decode_manifest({**record,
                         "result": base64.b64encode(msgspec.msgpack.encode(old)).decode()})


class FakeWorld:
    def __init__(self, views, rank=0):
        self.views = views
        self.rank = rank
        self.aborted = None

    def allgather(self, mine):
        return [mine if i == self.rank else view for i, view in enumerate(self.views)]

    def Get_rank(self):
        return self.rank

    def Abort(self, status):
        self.aborted = status
        raise SystemExit(status)


@pytest.fixture
def launch_ok(monkeypatch):
    monkeypatch.setattr(capability, "launch_problem", lambda: None)
    monkeypatch.setattr(capability, "probe_problem", lambda: None)


def test_every_rank_able_and_agreeing_runs_with_recovery(launch_ok):
    digest = capability.policy_digest()
    for requested in (capability.FaultTolerance.ON, capability.FaultTolerance.AUTO):
        decision = capability.decide(FakeWorld([None, (None, digest)]), requested)
        assert decision.enabled and decision.reason.startswith(f"on ({requested.value})")


def test_auto_without_ulfm_runs_without_recovery_and_says_why(launch_ok):
    world = FakeWorld([None, ("mpiexec was not started with --with-ft ulfm",
                              capability.policy_digest())])
    decision = capability.decide(world, capability.FaultTolerance.AUTO)
    assert not decision.enabled
    assert decision.reason == ("off (auto): rank 1: mpiexec was not started with --with-ft "
                               "ulfm; a dead rank ends the job")
    assert world.aborted is None


def test_on_without_ulfm_or_with_a_disagreeing_rank_aborts_with_status_74(launch_ok, capsys):
    world = FakeWorld([None, ("no ULFM", capability.policy_digest())])
    with pytest.raises(SystemExit):
        capability.decide(world, capability.FaultTolerance.ON)
    assert world.aborted == capability.ABORT_STATUS == 74
    assert capsys.readouterr().out == ("symcc-mpi: error: --fault-tolerance on, but rank 1: "
                                       "no ULFM\n")
    disagreeing = FakeWorld([None, (None, "0" * 64)])
    with pytest.raises(SystemExit):
        capability.decide(disagreeing, capability.FaultTolerance.ON)
    assert disagreeing.aborted == 74


def test_off_asks_nothing_of_mpi(monkeypatch):
    def fail():
        raise AssertionError("probed although off")

    monkeypatch.setattr(capability, "launch_problem", fail)
    monkeypatch.setattr(capability, "probe_problem", fail)
    world = FakeWorld([None, (None, capability.policy_digest())])
    assert not capability.decide(world, capability.FaultTolerance.OFF).enabled


def test_the_launch_check_reads_what_mpiexec_hands_its_ranks():
    environment = {"OMPI_MCA_mpi_ft_enable": "1", "OMPI_MCA_pml": "ob1"}
    assert capability.launch_problem(environment) is None
    assert "--with-ft ulfm" in capability.launch_problem({"OMPI_MCA_pml": "ob1"})
    assert "ob1" in capability.launch_problem({"OMPI_MCA_mpi_ft_enable": "1"})
