"""How a loop waits: the nap schedule (transport.Naps) and the doorbell that cuts naps short."""

from __future__ import annotations

import time

import pytest

from symcc_mpi.wire.doorbell import Doorbell, Ringer
from symcc_mpi.wire.transport import (
    CHASE_LAST,
    DOORBELL_NAP,
    LATENCY_SHARE,
    LONG_NAP,
    MAX_NAP,
    MIN_NAP,
    NAP_GROWTH,
    Naps,
)


def idle_naps(naps: Naps, count: int) -> list[float]:
    return [naps.after(active=False) for _ in range(count)]


def test_without_round_trips_naps_grow_from_the_minimum_to_the_default_cap():
    naps = Naps()
    assert naps.after(active=True) == 0.0
    series = idle_naps(naps, 60)
    assert series[0] == MIN_NAP
    assert series[1] == pytest.approx(MIN_NAP * NAP_GROWTH)
    assert all(b >= a for a, b in zip(series, series[1:], strict=False))
    assert series[-1] == MAX_NAP


def test_long_round_trips_give_naps_of_a_small_share_of_them():
    naps = Naps()
    for seconds in (0.08, 0.12, 0.1):
        naps.observe_round_trip(seconds)
    naps.after(active=True)
    first = LATENCY_SHARE * 0.1  # the median
    assert idle_naps(naps, 3) == pytest.approx([first] * 3)


def test_round_trips_are_summarised_by_their_median_and_naps_stay_bounded():
    naps = Naps()
    for seconds in (0.001, 0.001, 100.0):  # one very long task does not make naps long
        naps.observe_round_trip(seconds)
    naps.after(active=True)
    assert idle_naps(naps, 1) == [MIN_NAP]
    for _ in range(10):
        naps.observe_round_trip(100.0)
    naps.after(active=True)
    assert idle_naps(naps, 2) == [LONG_NAP, LONG_NAP]


def test_with_every_peer_ringing_a_nap_is_long_until_a_ring_comes_without_its_message():
    naps = Naps()
    naps.doorbell = True
    assert naps.after(active=True) == DOORBELL_NAP  # what came during the round has rung
    assert idle_naps(naps, 2) == [DOORBELL_NAP, DOORBELL_NAP]
    # The ring woke us but the round found nothing: a short chase, then the bell again.
    chase = [naps.after(active=False, rang=True)] + idle_naps(naps, 8)
    assert chase == pytest.approx([MIN_NAP * 2 ** k for k in range(7)]
                                  + [DOORBELL_NAP, DOORBELL_NAP])
    assert chase[6] == pytest.approx(CHASE_LAST)
    naps.after(active=False, rang=True)
    assert naps.after(active=True) == DOORBELL_NAP  # found it: no more chasing
    assert naps.after(active=False) == DOORBELL_NAP


def test_with_sends_of_its_own_in_flight_a_ringing_loop_naps_on_the_schedule():
    """A send progresses only in the sender's MPI calls, and its receiver has nothing to
    ring for while it waits for the rest of it: the bell's long nap would stall it."""
    naps = Naps()
    naps.doorbell = True
    assert naps.after(active=True, sending=True) == 0.0
    series = [naps.after(active=False, sending=True) for _ in range(3)]
    assert series == pytest.approx([MIN_NAP, MIN_NAP * NAP_GROWTH, MIN_NAP * NAP_GROWTH ** 2])
    assert naps.after(active=False) == DOORBELL_NAP  # sent: the bell again


def test_a_ring_wakes_the_waiting_master_and_every_pending_ring_is_drained():
    bell = Doorbell()
    try:
        ringer = Ringer(bell.address)
        assert ringer.reachable
        for _ in range(5):
            ringer.ring()
        started = time.monotonic()
        assert bell.wait(30.0)  # the probe ring and five more, in one wake-up
        assert time.monotonic() - started < 10.0
        assert not bell.wait(0.0)
        ringer.close()
    finally:
        bell.close()


def test_rings_drained_before_a_probe_do_not_wake_the_next_wait():
    bell = Doorbell()
    try:
        ringer = Ringer(bell.address)
        bell.drain()  # the ring Ringer() sends to learn whether the bell answers
        assert not bell.drain()
        ringer.ring()
        ringer.ring()
        assert bell.drain()  # the master's round, before it probes MPI
        assert not bell.wait(0.01)  # nothing left to wake it for the messages it handled
        ringer.close()
    finally:
        bell.close()


def test_without_a_ring_the_wait_ends_at_its_timeout():
    bell = Doorbell()
    try:
        assert not bell.wait(0.01)
    finally:
        bell.close()


@pytest.mark.parametrize("address", ["", "\0symcc-mpi-doorbell-nobody-listens"])
def test_a_bell_nobody_listens_at_is_unreachable_and_ringing_it_is_harmless(address):
    ringer = Ringer(address)
    assert not ringer.reachable
    ringer.ring()
    ringer.close()


def test_a_ringer_never_blocks_on_a_master_that_does_not_drain():
    bell = Doorbell()
    try:
        ringer = Ringer(bell.address)
        for _ in range(100_000):  # far past the socket's buffer
            ringer.ring()
        assert ringer.reachable
        assert bell.wait(0.0)
        ringer.close()
    finally:
        bell.close()
