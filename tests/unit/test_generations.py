"""The generation log (durable/generations.py) against F443 §5: numbering, prepare and commit
with the ordinal/digest rules, lost acknowledgements, torn tails, damage, concurrent writers."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from symcc_mpi.durable.lines import encode_line, write_all
from symcc_mpi.ulfm.generations import (
    ForkRefused,
    GenerationLog,
    GenerationLogError,
    digest_of,
)

MEMBERS = ["host/100/1", "host/101/1", "host/102/1"]
SURVIVORS = ["host/100/1", "host/102/1"]


def _log(tmp_path: Path, **kw) -> GenerationLog:
    return GenerationLog(tmp_path / "state" / "generations.jsonl",
                         quarantine_dir=tmp_path / "quarantine", **kw)


def _plan(generation: int, members=MEMBERS) -> dict:
    return {"generation": generation, "members": list(members)}


def _receipt(plan: dict, members=SURVIVORS) -> dict:
    return {"generation": plan["generation"] + 1, "plan": digest_of(plan),
            "members": list(members),
            "failed": [m for m in plan["members"] if m not in members]}


def _recovered(log: GenerationLog, generation: int) -> None:
    plan = _plan(generation)
    log.prepare(plan)
    log.commit(_receipt(plan))


def _kinds(log: GenerationLog) -> list[tuple[str, int]]:
    return [(r.kind, r.generation) for r in log.records()]


class Raising:
    """A writer that writes `keep` bytes of the line (all of them when None), then raises: the
    append reached the file, or part of it did, and the writer never learned which."""

    def __init__(self, keep: int | None = None):
        self.keep = keep
        self.armed = True

    def __call__(self, fd: int, data: bytes) -> None:
        if not self.armed:
            write_all(fd, data)
            return
        self.armed = False
        write_all(fd, data if self.keep is None else data[:self.keep])
        raise OSError(5, "Input/output error")


# -- numbering ------------------------------------------------------------------------------


def test_an_empty_log_has_no_records_and_no_current_generation(tmp_path):
    log = _log(tmp_path)
    assert log.records() == []
    assert log.current() is None
    assert not log.path.exists()  # a reader creates nothing


def test_the_first_run_starts_generation_0_with_its_members_and_extra(tmp_path):
    record = _log(tmp_path).start(MEMBERS, {"began": 12.5, "run": "r1"})
    assert (record.ordinal, record.kind, record.generation) == (0, "start", 0)
    assert record.body == {"members": MEMBERS, "began": 12.5, "run": "r1"}
    assert _log(tmp_path).current() == record


def test_a_later_run_starts_one_past_the_last_generation_of_any_run(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {"run": "r1"})
    _recovered(log, 0)
    second = _log(tmp_path).start(SURVIVORS, {"run": "r2"})  # a new process: --resume
    assert second.generation == 2
    assert _kinds(log) == [("start", 0), ("prepare", 0), ("commit", 1), ("start", 2)]
    assert log.first_of_run(1).body["run"] == "r1"
    assert log.first_of_run(2).body["run"] == "r2"


def test_a_run_after_an_unfinished_recovery_does_not_reuse_the_prepared_generation(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    log.prepare(_plan(0))  # every survivor died before the commit
    assert log.start(SURVIVORS, {}).generation == 1
    with pytest.raises(ForkRefused, match="after generation 1 began"):
        log.commit(_receipt(_plan(0)))  # the unfinished recovery is over for good
    assert _kinds(log) == [("start", 0), ("prepare", 0), ("start", 1)]


# -- prepare --------------------------------------------------------------------------------


def test_prepare_of_the_same_plan_again_is_answered_from_the_record(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    first = log.prepare(_plan(0))
    again = _log(tmp_path).prepare(_plan(0))  # a second survivor confirming the first's plan
    assert again == first
    assert _kinds(log) == [("start", 0), ("prepare", 0)]


def test_prepare_of_another_plan_for_the_same_generation_is_a_fork(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    log.prepare(_plan(0))
    before = log.path.read_bytes()
    with pytest.raises(ForkRefused, match="prepare of generation 0 is already recorded"):
        log.prepare(_plan(0, members=SURVIVORS))
    assert log.path.read_bytes() == before


@pytest.mark.parametrize("generation", [1, -1, 7])
def test_prepare_of_a_generation_that_is_not_current_is_refused(tmp_path, generation):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    before = log.path.read_bytes()
    with pytest.raises(GenerationLogError, match=f"generation {generation} was asked, the "
                                                 "current one is 0"):
        log.prepare(_plan(generation))
    assert log.path.read_bytes() == before


def test_prepare_before_any_start_is_refused(tmp_path):
    with pytest.raises(GenerationLogError, match="the current one is none"):
        _log(tmp_path).prepare(_plan(0))


def test_prepare_of_a_generation_already_recovered_from_is_not_repeated(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    _recovered(log, 0)
    assert log.prepare(_plan(0)).ordinal == 1  # a late survivor: the record's answer
    with pytest.raises(ForkRefused):
        log.prepare(_plan(0, members=SURVIVORS))
    assert _kinds(log) == [("start", 0), ("prepare", 0), ("commit", 1)]


# -- commit ---------------------------------------------------------------------------------


def test_commit_advances_the_generation_by_one_with_the_receipt(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    plan = _plan(0)
    log.prepare(plan)
    record = log.commit(_receipt(plan))
    assert (record.ordinal, record.kind, record.generation) == (2, "commit", 1)
    assert log.current() == record
    assert record.body["members"] == SURVIVORS


@pytest.mark.parametrize("plan_digest", [None, "0" * 64, digest_of(_plan(0, SURVIVORS))])
def test_commit_without_the_exact_prepared_plan_digest_is_refused(tmp_path, plan_digest):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    log.prepare(_plan(0))
    receipt = {"generation": 1, "members": SURVIVORS, "failed": [MEMBERS[1]]}
    if plan_digest is not None:
        receipt["plan"] = plan_digest
    before = log.path.read_bytes()
    with pytest.raises(ForkRefused, match="names no plan prepared"):
        log.commit(receipt)
    assert log.path.read_bytes() == before


def test_commit_without_a_prepare_is_refused(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    with pytest.raises(ForkRefused, match="receipt of generation 1 names no plan"):
        log.commit(_receipt(_plan(0)))


def test_commit_that_skips_a_generation_is_refused(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    plan = _plan(0)
    log.prepare(plan)
    with pytest.raises(ForkRefused):
        log.commit({**_receipt(plan), "generation": 2})
    assert log.current().generation == 0


def test_commit_of_the_same_receipt_again_is_answered_and_of_another_is_a_fork(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    plan = _plan(0)
    log.prepare(plan)
    first = log.commit(_receipt(plan))
    assert _log(tmp_path).commit(_receipt(plan)) == first
    with pytest.raises(ForkRefused, match="commit of generation 1 is already recorded"):
        log.commit(_receipt(plan, members=[SURVIVORS[1], SURVIVORS[0]]))  # another order
    assert _kinds(log) == [("start", 0), ("prepare", 0), ("commit", 1)]


@pytest.mark.parametrize("step", ["prepare", "commit"])
def test_a_lost_acknowledgement_is_reconciled_by_retrying(tmp_path, step):
    """F443 §5: the append reached the log, the writer raised; the retry reads the record."""
    writer = Raising()
    log = _log(tmp_path, writer=write_all)
    log.start(MEMBERS, {})
    plan = _plan(0)
    if step == "commit":
        log.prepare(plan)
    unsure = _log(tmp_path, writer=writer)
    request = (lambda: unsure.prepare(plan)) if step == "prepare" else (
        lambda: unsure.commit(_receipt(plan)))
    with pytest.raises(OSError):
        request()
    landed = log.records()[-1]
    assert landed.kind == step  # it did land
    assert request() == landed  # the retry is answered from it, nothing appended twice
    assert [r.kind for r in log.records()].count(step) == 1


def test_an_idempotent_answer_makes_the_record_durable(tmp_path, monkeypatch):
    """The record's writer may have died between its write and its fsync: whoever acts on
    the record answers from it only once it is synced."""
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    plan = _plan(0)
    with pytest.raises(OSError):
        _log(tmp_path, writer=Raising()).prepare(plan)  # written, never fsynced
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    log.prepare(plan)
    assert synced


# -- damage ---------------------------------------------------------------------------------


def test_a_torn_tail_is_no_record_for_a_reader_which_leaves_it_alone(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    with pytest.raises(OSError):
        _log(tmp_path, writer=Raising(keep=20)).prepare(_plan(0))  # killed inside the append
    torn = log.path.read_bytes()
    assert not torn.endswith(b"\n")
    assert _kinds(log) == [("start", 0)]
    assert log.current().generation == 0
    assert log.path.read_bytes() == torn
    assert not (tmp_path / "quarantine").exists()


def test_the_next_writer_cuts_a_torn_tail_into_quarantine_and_appends(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    whole = log.path.read_bytes()
    with pytest.raises(OSError):
        _log(tmp_path, writer=Raising(keep=20)).prepare(_plan(0))
    fragment = log.path.read_bytes()[len(whole):]
    record = log.prepare(_plan(0))
    assert record.ordinal == 1
    assert _kinds(log) == [("start", 0), ("prepare", 0)]
    kept = tmp_path / "quarantine" / f"generations.jsonl.torn-at-{len(whole)}"
    assert kept.read_bytes() == fragment
    reasons = (tmp_path / "quarantine" / "REASONS").read_text()
    assert f"{kept.name}: interrupted append cut from {log.path} at byte {len(whole)}" in reasons


def test_a_torn_first_line_is_cut_to_an_empty_log(tmp_path):
    with pytest.raises(OSError):
        _log(tmp_path, writer=Raising(keep=5)).start(MEMBERS, {})
    log = _log(tmp_path)
    assert log.records() == []
    assert log.start(MEMBERS, {}).generation == 0
    assert (tmp_path / "quarantine" / "generations.jsonl.torn-at-0").exists()


def _three_records(tmp_path) -> GenerationLog:
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    log.prepare(_plan(0))
    log.commit(_receipt(_plan(0)))
    return log


def test_a_corrupt_middle_line_is_an_error_naming_path_and_line(tmp_path):
    log = _three_records(tmp_path)
    lines = log.path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"prepare"', b'"prepaRe"')
    log.path.write_bytes(b"\n".join(lines))
    damaged = log.path.read_bytes()
    with pytest.raises(GenerationLogError, match=rf"{log.path}, line 2: checksum mismatch"):
        log.records()
    with pytest.raises(GenerationLogError, match=r"line 2"):
        log.prepare(_plan(1, SURVIVORS))  # a writer refuses too, and writes nothing
    assert log.path.read_bytes() == damaged


def test_a_record_whose_digest_is_not_its_bodys_is_an_error(tmp_path):
    log = _log(tmp_path)
    log.path.parent.mkdir(parents=True)
    log.path.write_bytes(encode_line({"ordinal": 0, "kind": "start", "generation": 0,
                                      "body": {"members": MEMBERS}, "digest": "0" * 64}))
    with pytest.raises(GenerationLogError, match=r"line 1: the record's digest is not"):
        log.records()


def test_an_unknown_record_kind_is_an_error(tmp_path):
    log = _log(tmp_path)
    log.path.parent.mkdir(parents=True)
    body = {"members": MEMBERS}
    log.path.write_bytes(encode_line({"ordinal": 0, "kind": "restart", "generation": 0,
                                      "body": body, "digest": digest_of(body)}))
    with pytest.raises(GenerationLogError, match=r"line 1: unknown record kind 'restart'"):
        log.records()


def test_an_ordinal_gap_is_an_error_naming_path_and_line(tmp_path):
    log = _three_records(tmp_path)
    lines = log.path.read_bytes().split(b"\n")
    del lines[1]  # the prepare is gone: ordinals 0, 2
    log.path.write_bytes(b"\n".join(lines))
    with pytest.raises(GenerationLogError,
                       match=rf"{log.path}, line 2: ordinal 2 where 1 was due"):
        log.records()


# -- concurrent writers ---------------------------------------------------------------------


def _survivor(path: str, quarantine: str, barrier, answers) -> None:
    log = GenerationLog(Path(path), quarantine_dir=Path(quarantine))
    plan = _plan(0)
    barrier.wait()
    prepared = log.prepare(plan)
    barrier.wait()
    committed = log.commit(_receipt(plan))
    answers.put((prepared.ordinal, prepared.digest, committed.ordinal, committed.digest))


def test_survivors_preparing_and_committing_at_once_write_each_record_once(tmp_path):
    """Real processes (flock is the arbiter): the concurrent prepare of F443 §6.2."""
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    context = multiprocessing.get_context("spawn")
    survivors = 4
    barrier, answers = context.Barrier(survivors), context.Queue()
    processes = [context.Process(target=_survivor, args=(str(log.path),
                                                         str(log.quarantine_dir),
                                                         barrier, answers))
                 for _ in range(survivors)]
    for process in processes:
        process.start()
    results = [answers.get(timeout=120) for _ in processes]
    for process in processes:
        process.join()
        assert process.exitcode == 0
    assert len(set(results)) == 1
    assert results[0][0] == 1 and results[0][2] == 2
    assert _kinds(log) == [("start", 0), ("prepare", 0), ("commit", 1)]


# -- an end on purpose ----------------------------------------------------------------------


def test_an_end_on_purpose_is_on_record_for_its_generation_only(tmp_path):
    log = _log(tmp_path)
    log.start(MEMBERS, {})
    assert log.ended(0) is None
    log.end(0, 70, "workers did not acknowledge STOP")
    assert log.ended(0).body == {"status": 70, "reason": "workers did not acknowledge STOP"}
    assert log.ended(1) is None
    assert log.current().generation == 0  # an end begins nothing
    assert _kinds(log) == [("start", 0), ("end", 0)]
