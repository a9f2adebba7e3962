"""target_claims.TargetClaims: one master's claims on the shared target table, its TTL
setting, heartbeats and the figures it reports."""

from __future__ import annotations

import dataclasses
import logging

from symcc_mpi.config import TARGET_LEASE_TTL_ENV
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.target_claims import ClaimStatistics, TargetClaims, target_ttl


def masters(tmp_path, clock, ttl="3"):
    env = {TARGET_LEASE_TTL_ENV: ttl}
    return [TargetClaims(tmp_path / "targets", owner=f"master-{k}", work_ttl=120.0,
                         clock=clock, env=env) for k in (0, 1)]


def test_the_ttl_defaults_to_the_work_leases_and_a_bad_setting_is_named():
    assert target_ttl(120.0, {}) == (120.0, "")
    assert target_ttl(120.0, {TARGET_LEASE_TTL_ENV: " 2.5 "}) == (2.5, "")
    for bad in ("0", "-1", "nan", "inf", "soon"):
        ttl, rejected = target_ttl(120.0, {TARGET_LEASE_TTL_ENV: bad})
        assert ttl == 120.0 and rejected == f"{TARGET_LEASE_TTL_ENV}={bad!r}"


def test_overlapping_groups_of_two_masters_are_refused_until_released(tmp_path):
    clock = ManualClock()
    first, second = masters(tmp_path, clock)
    assert first.claim("a#1", (1, 2)) and not second.claim("b#1", (2, 3))
    assert second.claim("b#2", (3, 4))
    first.release("a#1")
    assert second.claim("b#1", (2,))
    assert dataclasses.replace(first.statistics(), ttl=0) == ClaimStatistics(
        claims=1, conflicts=0, releases=1, expiries=0, steals=0, errors=0, held=0, ttl=0)
    assert second.statistics().conflicts == 1 and second.statistics().held == 2


def test_a_paused_holder_loses_its_group_at_the_ttl_and_its_late_release_deletes_nothing(
        tmp_path, caplog):
    clock = ManualClock()
    paused, other = masters(tmp_path, clock)
    assert paused.claim("a#1", (1, 2))
    clock.advance(2.9)
    assert not other.claim("b#1", (2,))
    clock.advance(0.2)  # past the 3 s TTL: no heartbeat came
    assert other.claim("b#1", (2,)) and other.statistics().steals == 1
    with caplog.at_level(logging.WARNING, "symcc_mpi.targets"):
        paused.round(1e9)  # it wakes up: the heartbeat finds the group taken over
        paused.round(2e9)
    assert paused.statistics().expiries == 1  # counted once
    paused.release("a#1")
    assert other.table.read(2).token == other.held["b#1"][0]  # the new owner's, intact
    assert other.table.read(1) is None  # still the paused master's: released


def test_a_holder_that_commits_before_its_next_heartbeat_finds_the_loss_at_its_release(
        tmp_path):
    clock = ManualClock()
    paused, other = masters(tmp_path, clock)
    assert paused.claim("a#1", (1, 2))
    clock.advance(3.1)
    assert other.claim("b#1", (2,))
    paused.release("a#1")  # its result came first: no heartbeat ran since the pause
    assert paused.statistics().expiries == 1 and paused.statistics().releases == 1
    assert other.table.read(2).token == other.held["b#1"][0]


def test_heartbeats_keep_a_running_group_past_the_ttl(tmp_path):
    clock = ManualClock()
    holder, other = masters(tmp_path, clock)
    assert holder.interval == 1.0  # a third of the 3 s TTL
    assert holder.claim("a#1", (5,))
    for second in range(1, 10):
        clock.advance(1.0)
        holder.round(float(second))
    assert not other.claim("b#1", (5,))
    holder.release_all()
    assert other.claim("b#1", (5,)) and holder.statistics().expiries == 0


def test_a_table_that_cannot_be_written_refuses_the_claim_and_the_group_waits(tmp_path, caplog):
    claims, _ = masters(tmp_path, ManualClock())
    shard = claims.table.path(1).parent
    shard.rmdir()
    shard.write_bytes(b"")  # a file where the shard's directory was: every write fails
    with caplog.at_level(logging.WARNING, "symcc_mpi.targets"):
        assert not claims.claim("a#1", (1,))
    assert claims.statistics().errors == 1 and "not claimed" in caplog.text
    assert not claims.held
