import threading

import pytest

from symcc_mpi.roles.faults import (
    DEFAULT_PAUSE_SECONDS,
    HELD_FILE,
    RELEASE_FILE,
    FaultKind,
    Faults,
    hold_until_released,
)


def test_faults_apply_to_their_rank_only():
    faults = Faults(1, "1:foreign-result@2, 2:malformed-result@1")
    assert faults.fire(FaultKind.FOREIGN_RESULT, 2)
    assert not faults.fire(FaultKind.FOREIGN_RESULT, 1)
    assert not faults.fire(FaultKind.MALFORMED_RESULT, 1)
    assert Faults(2, "1:foreign-result@2,2:malformed-result@1").fire(FaultKind.MALFORMED_RESULT, 1)


def test_master_faults_belong_to_rank_zero():
    faults = Faults(0, "0:send-fail@3,0:object-send-fail@1,1:stale-result@2")
    assert faults.fire(FaultKind.SEND_FAIL, 3) and faults.fire(FaultKind.OBJECT_SEND_FAIL, 1)
    assert not faults.fire(FaultKind.STALE_RESULT, 2)


def test_a_pause_lasts_its_seconds_or_the_default():
    faults = Faults(1, "1:pause@2=3.5,1:pause@4")
    assert faults.fire(FaultKind.PAUSE, 2) and faults.pause_seconds(2) == 3.5
    assert faults.pause_seconds(4) == DEFAULT_PAUSE_SECONDS


@pytest.mark.parametrize("spec", ["1:explode@2", "x:foreign-result@1", "1:foreign-result",
                                  "1:send-fail@1", "0:foreign-result@1", "1:pause@1=never",
                                  "1:pause@1=-2", "1:malformed-result@1=3", "1:stop@1",
                                  "0:slow-link@1"])
def test_bad_fault_spec_is_refused(spec):
    with pytest.raises(ValueError, match="SYMCC_MPI_FAULTS"):
        Faults(1, spec)


def test_commit_faults_are_master_kinds_and_absent_plans_cost_nothing(tmp_path):
    faults = Faults(0, "0:kill-before-done-append@2,0:torn-done-append@3")
    assert faults.commit_probe() is not None and faults.done_writer(tmp_path) is not None
    faults.commit_probe()("before-done-append", 1)  # not the 2nd commit: nothing happens
    faults.commit_probe()("after-done-fsync", 2)  # not the planned step: nothing happens
    assert Faults(0, "0:send-fail@1").commit_probe() is None
    assert Faults(0, "0:send-fail@1").done_writer(tmp_path) is None
    with pytest.raises(ValueError, match="SYMCC_MPI_FAULTS"):
        Faults(0, "1:kill-after-done-fsync@1")  # a worker has no group commit


def test_a_torn_append_writes_half_then_the_rest_once_released(tmp_path):
    from symcc_mpi.roles.faults import RELEASE_FILE

    (tmp_path / RELEASE_FILE).touch()  # released already: the write completes at once
    writer = Faults(0, "0:torn-done-append@2").done_writer(tmp_path)
    path = tmp_path / "j"
    with open(path, "wb") as handle:
        for data in (b"first\n", b"second\n"):
            writer(handle.fileno(), data)
    assert path.read_bytes() == b"first\nsecond\n"


def test_a_worker_held_until_released_says_so_and_waits_for_the_test(tmp_path):
    faults = Faults(2, "2:pause@1=release")
    assert faults.paused_until_released(1) and not faults.paused_until_released(2)
    holder = threading.Thread(target=hold_until_released, args=(tmp_path, 2))
    holder.start()
    held = tmp_path / HELD_FILE.format(2)
    while not held.exists():  # it says it holds before it waits
        assert holder.is_alive()
        holder.join(0.01)
    holder.join(0.2)
    assert holder.is_alive()  # and waits for the release, however long it takes
    (tmp_path / RELEASE_FILE).touch()
    holder.join()
    assert not held.exists()


def test_a_rank_released_alone_leaves_the_others_held(tmp_path):
    assert Faults(3, "m1:pause@2=release", master_index=1).paused_until_released(2)
    holders = {rank: threading.Thread(target=hold_until_released, args=(tmp_path, rank))
               for rank in (1, 3)}
    for holder in holders.values():
        holder.start()
    while not all((tmp_path / HELD_FILE.format(rank)).exists() for rank in holders):
        assert all(holder.is_alive() for holder in holders.values())
        holders[1].join(0.01)
    (tmp_path / f"{RELEASE_FILE}-3").touch()
    holders[3].join()
    assert not (tmp_path / f"{RELEASE_FILE}-3").exists()  # taken: it releases once
    assert not (tmp_path / HELD_FILE.format(3)).exists()
    holders[1].join(0.2)
    assert holders[1].is_alive() and (tmp_path / HELD_FILE.format(1)).exists()
    (tmp_path / RELEASE_FILE).touch()
    holders[1].join()
