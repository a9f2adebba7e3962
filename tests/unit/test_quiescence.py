"""The two-phase quiescence gate (F320 §2.5), one step at a time, with time passed in."""

import itertools
import pickle

import msgspec
import pytest

from symcc_mpi.federation.quiescence import Coordinator, Outcome, Participant
from symcc_mpi.wire.control import (
    Abort,
    Ack,
    Commit,
    MalformedControl,
    Prepare,
    Status,
    Vote,
    decode,
    encode,
)

WINDOW, STALE_AFTER, REFRESH = 2.0, 3.0, 1.0
ROOT = 0
FOREIGN = "f" * 32


def counting_bytes():
    """A random source that never repeats: tokens 00..01, 00..02, ..."""
    numbers = itertools.count(1)
    return lambda size: next(numbers).to_bytes(size, "big")


def coordinator(masters=3):
    return Coordinator(masters, window=WINDOW, stale_after=STALE_AFTER,
                       random_bytes=counting_bytes())


def all_idle(root, masters, now, sequence=1):
    for master in range(masters):
        root.on_status(master, Status(sequence, idle=True), now)


def propose(root, masters=3, now=0.0):
    """Every master idle at `now`; returns the token of the PREPARE proposed a window later."""
    all_idle(root, masters, now)
    sent = root.tick(now + WINDOW)
    assert [destination for destination, _ in sent] == list(range(masters))
    assert len({message for _, message in sent}) == 1
    prepare = sent[0][1]
    assert isinstance(prepare, Prepare)
    return prepare.token


def prepared_participant(token, now=0.0):
    participant = Participant(refresh=REFRESH)
    participant.status(True, now)
    vote = participant.on_prepare(ROOT, Prepare(token), still_idle=True)
    assert vote == Vote(token, yes=True) and participant.frozen
    return participant


def test_happy_path_commits_every_master():
    masters = 3
    root = coordinator(masters)
    participants = [Participant(refresh=REFRESH) for _ in range(masters)]
    for master, participant in enumerate(participants):
        root.on_status(master, participant.status(True, 0.0), 0.0)
    assert root.tick(WINDOW - 0.01) == []  # not idle for a whole window yet
    sent = root.tick(WINDOW)
    assert [(destination, type(message)) for destination, message in sent] == [
        (master, Prepare) for master in range(masters)]
    for destination, prepare in sent:
        vote = participants[destination].on_prepare(ROOT, prepare, still_idle=True)
        assert vote.yes and participants[destination].frozen
        root.on_vote(destination, vote)
    commits = root.tick(WINDOW + 0.1)
    assert commits == [(master, Commit(sent[0][1].token)) for master in range(masters)]
    assert root.outcome is Outcome.RUNNING  # not before every exact ACK
    for destination, commit in commits:
        ack = participants[destination].on_commit(ROOT, commit)
        assert ack == Ack(commit.token, committed=True)
        assert participants[destination].done
        root.on_ack(destination, ack)
    assert root.outcome is Outcome.COMMITTED and root.conflict is None
    statistics = root.statistics()
    assert (statistics.proposals, statistics.aborts) == (1, 0)
    assert participants[1].statistics().yes_votes == 1
    assert participants[1].status(False, 10.0) is None  # it left its loop


def test_a_busy_vote_aborts_exactly_the_yes_voters():
    root = coordinator()
    token = propose(root)
    root.on_vote(0, Vote(token, yes=True))
    root.on_vote(1, Vote(token, yes=False))
    assert root.tick(WINDOW) == []  # root waits for every vote before it decides
    root.on_vote(2, Vote(token, yes=True))
    assert root.tick(WINDOW) == [(0, Abort(token)), (2, Abort(token))]
    assert root.outcome is Outcome.RUNNING
    assert root.statistics().aborts == 1
    participant = prepared_participant(token)
    participant.on_abort(ROOT, Abort(token))
    assert not participant.frozen and participant.statistics().aborts == 1


def test_a_busy_status_while_preparing_aborts_even_if_every_vote_is_yes():
    root = coordinator()
    token = propose(root)
    root.on_status(2, Status(2, idle=False), WINDOW)
    root.on_status(2, Status(3, idle=True), WINDOW)  # busy and idle again: still doomed
    for master in range(3):
        root.on_vote(master, Vote(token, yes=True))
    assert root.tick(WINDOW) == [(master, Abort(token)) for master in range(3)]


def test_a_vote_after_the_abort_is_counted_not_acted_upon():
    root = coordinator(2)
    token = propose(root, 2)
    root.on_vote(0, Vote(token, yes=False))
    root.on_vote(1, Vote(token, yes=True))
    root.tick(WINDOW)
    root.on_vote(1, Vote(token, yes=True))
    root.on_ack(1, Ack(token, committed=True))
    statistics = root.statistics()
    assert statistics.unknown_token == 2 and root.outcome is Outcome.RUNNING


def test_root_proposes_again_only_after_a_new_idle_window():
    root = coordinator(2)
    first = propose(root, 2)
    root.on_vote(0, Vote(first, yes=False))
    root.on_vote(1, Vote(first, yes=False))
    now = WINDOW
    assert root.tick(now) == []  # aborted, nothing to tell: nobody froze
    assert root.tick(now + 10 * WINDOW) == []  # old idle statuses do not open a window
    all_idle(root, 2, now + 1, sequence=2)
    assert root.tick(now + 1 + WINDOW - 0.01) == []
    second = root.tick(now + 1 + WINDOW)
    assert [message for _, message in second] == [Prepare(second[0][1].token)] * 2
    assert second[0][1].token != first


def test_a_busy_status_restarts_the_window():
    root = coordinator(2)
    all_idle(root, 2, 0.0)
    root.on_status(1, Status(2, idle=False), 1.0)
    root.on_status(1, Status(3, idle=True), 1.5)
    assert root.tick(WINDOW + 1.0) == []
    root.on_status(0, Status(2, idle=True), 3.0)  # a refresh: master 0 stays fresh
    assert len(root.tick(1.5 + WINDOW)) == 2


def test_a_stale_status_blocks_prepare():
    root = coordinator(2)
    root.on_status(0, Status(1, idle=True), 0.0)
    root.on_status(1, Status(1, idle=True), 0.0)
    root.on_status(0, Status(2, idle=True), 3.0)  # master 0 refreshes, master 1 falls silent
    assert root.tick(STALE_AFTER + 0.5) == []
    root.on_status(1, Status(2, idle=True), 4.0)  # fresh again, idle all along
    assert len(root.tick(4.0)) == 2


def test_stale_and_out_of_order_sequences_are_counted_and_ignored():
    root = coordinator(2)
    root.on_status(0, Status(5, idle=True), 0.0)
    root.on_status(0, Status(4, idle=False), 0.5)  # an older busy status: not the latest
    root.on_status(0, Status(5, idle=False), 0.5)  # the same sequence again
    root.on_status(1, Status(1, idle=True), 0.0)
    assert root.statistics().stale_sequence == 2
    assert len(root.tick(WINDOW)) == 2  # master 0 has been idle since 0.0


def test_statuses_from_a_rank_that_is_not_a_master_are_counted():
    root = coordinator(2)
    root.on_status(2, Status(1, idle=True), 0.0)
    root.on_status(-1, Status(1, idle=True), 0.0)
    root.on_vote(7, Vote(FOREIGN, yes=True))
    assert root.statistics().wrong_source == 3


def test_a_busy_status_after_commit_is_a_conflict():
    root = coordinator(2)
    token = propose(root, 2)
    for master in range(2):
        root.on_vote(master, Vote(token, yes=True))
    root.tick(WINDOW)
    root.on_ack(0, Ack(token, committed=True))
    root.on_status(1, Status(2, idle=False), WINDOW + 1)
    assert root.outcome is Outcome.CONFLICT
    assert "master 1" in root.conflict and "\n" not in root.conflict
    root.on_ack(1, Ack(token, committed=True))  # too late to settle it otherwise
    assert root.outcome is Outcome.CONFLICT and root.statistics().late == 1


def committing(masters=2):
    root = coordinator(masters)
    token = propose(root, masters)
    for master in range(masters):
        root.on_vote(master, Vote(token, yes=True))
    assert len(root.tick(WINDOW)) == masters
    return root, token


def test_a_refused_ack_is_a_conflict():
    root, token = committing()
    root.on_ack(1, Ack(token, committed=False))
    assert root.outcome is Outcome.CONFLICT and "refused" in root.conflict


@pytest.mark.parametrize("answer", [
    lambda source, root: root.on_ack(source, Ack(FOREIGN, committed=True)),
    lambda source, root: root.on_vote(source, Vote(FOREIGN, yes=True)),
])
def test_a_vote_or_ack_of_another_token_after_commit_is_a_conflict(answer):
    root, _ = committing()
    answer(1, root)
    assert root.outcome is Outcome.CONFLICT and FOREIGN in root.conflict


def test_duplicate_answers_are_counted_not_conflicts():
    root, token = committing()
    root.on_vote(0, Vote(token, yes=True))
    root.on_ack(0, Ack(token, committed=True))
    root.on_ack(0, Ack(token, committed=True))
    root.on_ack(1, Ack(token, committed=True))
    assert root.outcome is Outcome.COMMITTED and root.statistics().duplicate == 2


def test_only_the_exact_token_aborts():
    token = "1" * 32
    participant = prepared_participant(token)
    participant.on_abort(ROOT, Abort(FOREIGN))
    participant.on_abort(1, Abort(token))  # not from root
    assert participant.frozen
    statistics = participant.statistics()
    assert (statistics.unknown_token, statistics.wrong_source) == (1, 1)


def test_a_commit_of_another_token_is_refused():
    token = "1" * 32
    participant = prepared_participant(token)
    assert participant.on_commit(ROOT, Commit(FOREIGN)) == Ack(FOREIGN, committed=False)
    assert not participant.done and participant.frozen
    unprepared = Participant(refresh=REFRESH)
    assert unprepared.on_commit(ROOT, Commit(token)) == Ack(token, committed=False)
    assert not unprepared.done
    assert participant.statistics().refused_commits == 1


def test_committed_stays_frozen_and_ignores_what_follows():
    token = "1" * 32
    participant = prepared_participant(token)
    assert participant.on_commit(ROOT, Commit(token)).committed
    participant.on_abort(ROOT, Abort(token))
    assert participant.done and participant.frozen
    assert participant.on_prepare(ROOT, Prepare("2" * 32), still_idle=True) is None
    assert participant.on_commit(ROOT, Commit(token)) == Ack(token, committed=True)
    statistics = participant.statistics()
    assert (statistics.late, statistics.duplicate, statistics.unknown_token) == (1, 1, 1)


def test_a_busy_master_votes_busy_and_does_not_freeze():
    participant = Participant(refresh=REFRESH)
    participant.status(True, 0.0)
    vote = participant.on_prepare(ROOT, Prepare("1" * 32), still_idle=False)
    assert vote == Vote("1" * 32, yes=False) and not participant.frozen


def test_a_yes_needs_the_latest_status_to_have_said_idle():
    """Busy at its last round: root may not hold that busy status yet, so the vote says it."""
    participant = Participant(refresh=REFRESH)
    participant.status(False, 0.0)
    assert not participant.on_prepare(ROOT, Prepare("1" * 32), still_idle=True).yes


def test_a_prepare_not_from_root_is_ignored():
    participant = Participant(refresh=REFRESH)
    participant.status(True, 0.0)
    assert participant.on_prepare(2, Prepare("1" * 32), still_idle=True) is None
    assert not participant.frozen and participant.statistics().wrong_source == 1


def test_statuses_go_out_on_change_at_once_and_otherwise_every_refresh():
    participant = Participant(refresh=REFRESH)
    assert participant.status(True, 0.0) == Status(1, idle=True)
    assert participant.status(True, 0.5) is None
    assert participant.status(False, 0.6) == Status(2, idle=False)
    assert participant.status(False, 1.5) is None
    assert participant.status(False, 1.6) == Status(3, idle=False)
    assert participant.status(True, 1.7) == Status(4, idle=True)
    assert participant.statistics().statuses == 4


@pytest.mark.parametrize("message", [
    Status(1, idle=True), Prepare("a" * 32), Vote("b" * 32, yes=False), Abort("c" * 32),
    Commit("d" * 32), Ack("e" * 32, committed=True),
])
def test_every_message_round_trips(message):
    assert decode(encode(message)) == message


@pytest.mark.parametrize("raw", [
    b"",
    b"\xff\x00garbage",
    pickle.dumps(Status(1, idle=True)),
    msgspec.msgpack.encode({"type": "shutdown", "token": "a" * 32}),
    msgspec.msgpack.encode({"type": "status", "sequence": 0, "idle": True}),
    msgspec.msgpack.encode({"type": "status", "sequence": 1, "idle": 1}),
    msgspec.msgpack.encode({"type": "status", "sequence": 1, "idle": True, "extra": 1}),
    msgspec.msgpack.encode({"type": "vote", "token": "../etc/passwd", "yes": True}),
    msgspec.msgpack.encode({"type": "ack", "token": "A" * 32, "committed": True}),
    msgspec.msgpack.encode({"type": "commit"}),
    msgspec.msgpack.encode(["prepare", "a" * 32]),
])
def test_malformed_bytes_raise_one_line(raw):
    with pytest.raises(MalformedControl) as error:
        decode(raw)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("arguments", [
    {"masters": 1, "window": 1.0, "stale_after": 1.0},
    {"masters": 2, "window": -1.0, "stale_after": 1.0},
    {"masters": 2, "window": 1.0, "stale_after": 0.0},
    {"masters": 2, "window": float("nan"), "stale_after": 1.0},
])
def test_bad_configuration_is_refused(arguments):
    masters = arguments.pop("masters")
    with pytest.raises(ValueError):
        Coordinator(masters, **arguments)


def test_a_random_source_of_the_wrong_size_is_refused():
    root = Coordinator(2, window=WINDOW, stale_after=STALE_AFTER, random_bytes=lambda _: b"x")
    all_idle(root, 2, 0.0)
    with pytest.raises(ValueError):
        root.tick(WINDOW)


def test_votes_that_do_not_come_abort_the_round_to_every_master():
    coordinator = Coordinator(2, window=1.0, stale_after=10.0, answer_within=5.0)
    for master in (0, 1):
        coordinator.on_status(master, Status(1, idle=True), 0.0)
    (_, prepare), _ = coordinator.tick(2.0)
    coordinator.on_vote(0, Vote(prepare.token, yes=True))
    assert coordinator.tick(6.0) == []  # within the deadline: still waiting for master 1
    aborts = coordinator.tick(7.5)
    assert aborts == [(0, Abort(prepare.token)), (1, Abort(prepare.token))]
    assert coordinator.outcome is Outcome.RUNNING
    assert coordinator.statistics().unanswered == 1
    # A late vote is of no open round; the late voter processes the ABORT after its PREPARE.
    coordinator.on_vote(1, Vote(prepare.token, yes=True))
    assert coordinator.statistics().unknown_token == 1


def test_acks_that_do_not_come_are_a_conflict():
    coordinator = Coordinator(2, window=1.0, stale_after=10.0, answer_within=5.0)
    for master in (0, 1):
        coordinator.on_status(master, Status(1, idle=True), 0.0)
    (_, prepare), _ = coordinator.tick(2.0)
    for master in (0, 1):
        coordinator.on_vote(master, Vote(prepare.token, yes=True))
    assert [type(m) for _, m in coordinator.tick(20.0)] == [Commit, Commit]  # stamped now
    coordinator.on_ack(0, Ack(prepare.token, committed=True))
    assert coordinator.tick(24.0) == [] and coordinator.outcome is Outcome.RUNNING
    coordinator.tick(25.5)
    assert coordinator.outcome is Outcome.CONFLICT
    assert "master(s) 1 did not acknowledge COMMIT" in coordinator.conflict


def test_a_new_root_without_a_decision_unfreezes_and_hears_a_status_at_once():
    token = propose(coordinator())
    participant = prepared_participant(token)
    assert participant.status(True, 0.1) is None  # unchanged, within the refresh
    participant.new_root(None)  # the dead root's PREPARE is void: no COMMIT of it went out
    assert not participant.frozen and not participant.done
    assert participant.status(True, 0.2) == Status(2, idle=True)
    assert participant.on_commit(ROOT, Commit(token)) == Ack(token, committed=False)
    assert participant.statistics().new_roots == 1


def test_a_new_root_after_the_decision_keeps_the_end_for_everyone():
    masters = 3
    root = coordinator(masters)
    token = propose(root, masters)
    for master in range(masters):
        root.on_vote(master, Vote(token, yes=True))
    assert root.decided == token  # on record before the COMMIT goes out with the tick
    successor = coordinator(masters)
    successor.inherit(root.decided)
    assert successor.outcome is Outcome.COMMITTED and successor.tick(10.0) == []
    frozen, fresh = prepared_participant(token), Participant(refresh=REFRESH)
    for participant in (frozen, fresh):  # a master, and the successor's own participant
        participant.new_root(token)
        assert participant.done and participant.status(True, 1.0) is None


def test_nothing_is_decided_while_the_votes_are_out():
    root = coordinator()
    token = propose(root)
    root.on_vote(0, Vote(token, yes=True))
    assert root.decided is None


def test_a_master_that_left_is_not_waited_for_and_gets_nothing():
    root = coordinator(3)
    root.leave(2)  # it withdrew from the work, then died
    all_idle(root, 2, 0.0)  # masters 0 and 1: enough for a window
    sent = root.tick(WINDOW)
    assert [destination for destination, _ in sent] == [0, 1]
    token = sent[0][1].token
    for master in (0, 1):
        root.on_vote(master, Vote(token, yes=True))
    assert [(d, type(m)) for d, m in root.tick(WINDOW)] == [(0, Commit), (1, Commit)]
    for master in (0, 1):
        root.on_ack(master, Ack(token, committed=True))
    assert root.outcome is Outcome.COMMITTED


@pytest.mark.parametrize("phase", ["votes", "acks"])
def test_a_master_that_leaves_while_awaited_lets_the_others_answers_decide(phase):
    root = coordinator(3)
    token = propose(root)
    for master in (0, 1):
        root.on_vote(master, Vote(token, yes=True))
    if phase == "acks":
        root.on_vote(2, Vote(token, yes=True))
        root.tick(WINDOW)
        for master in (0, 1):
            root.on_ack(master, Ack(token, committed=True))
    assert root.outcome is Outcome.RUNNING and root.decided == (token if phase == "acks"
                                                                else None)
    root.leave(2)
    if phase == "votes":  # decided without its vote: the COMMIT goes to those who voted
        assert root.decided == token
        assert [(d, type(m)) for d, m in root.tick(WINDOW)] == [(0, Commit), (1, Commit)]
    else:
        assert root.outcome is Outcome.COMMITTED


def test_a_busy_vote_is_not_overruled_by_a_master_that_leaves():
    root = coordinator(3)
    token = propose(root)
    root.on_vote(0, Vote(token, yes=True))
    root.on_vote(1, Vote(token, yes=False))
    root.leave(2)
    assert root.decided is None and root.tick(WINDOW) == [(0, Abort(token))]


def test_root_never_leaves():
    root = coordinator(2)
    root.leave(0)  # the coordinator itself
    all_idle(root, 1, 0.0)
    assert root.tick(WINDOW) == []  # master 1 is still awaited
    all_idle(root, 2, 0.0)
    assert [destination for destination, _ in root.tick(WINDOW)] == [0, 1]
