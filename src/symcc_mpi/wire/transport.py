"""Raw-bytes MPI messaging: typed envelopes out, strictly decoded envelopes in.

Waiting polls with `Iprobe` and a bounded, growing sleep: Open MPI's blocking receive spins
a core, and on a machine with as many workers as cores a spinning master or idle worker
takes CPU from the executors (DESIGN §8). Sends are non-blocking for the same reason: a
blocking `Send` of more than a few hundred bytes spins until the receiver, napping between
probes, takes it (measured with Open MPI 5.0.11's sm BTL: 2.7 ms of CPU per 500-byte send,
against 0.04 ms posted with `Isend` and completed by later probes). MPI keeps the order of
one sender's messages to one receiver either way.

Under ULFM (ulfm/), an MPI call that reports a dead peer or a revoked communicator raises
`RankFailure`, and nothing else: the caller's generation is over and `ulfm.runtime` repairs
the communicator. Without ULFM such a failure ends the job, as MPI's default handler does.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import msgspec
from mpi4py import MPI

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.wire.doorbell import Ringer
from symcc_mpi.wire.protocol import MalformedMessage, ResultField, Tag, decode, encode

MIN_NAP = 0.00005
MAX_NAP = 0.002
NAP_GROWTH = 1.25  # slow growth: naps stay short for a while after any activity
# A loop whose answers take long may nap longer: a nap delays the answer it sleeps through
# by at most its length, so naps of LATENCY_SHARE of the typical round trip cost the workers
# at most that share of their time. Each wake-up costs ~50 µs of CPU on these VMs, which
# at 2 ms naps was a third of the master's CPU on real SymCC (tasks of ~100 ms).
LATENCY_SHARE = 0.03
LONG_NAP = 0.02  # a bound all the same: stop requests and deadlines are checked on waking
ROUND_TRIP_WINDOW = 31
DOORBELL_NAP = 0.1  # when every peer rings after it sends (doorbell.py)
CHASE_GROWTH = 2.0
CHASE_LAST = 0.0032  # a chase after a ring naps 50, 100, 200 ... 3200 µs


class Naps:
    """How long to nap after a round that found nothing to do.

    Naps grow from `first` by NAP_GROWTH up to max(first, MAX_NAP). `first` is MIN_NAP until
    round trips are observed, then LATENCY_SHARE of their median, within [MIN_NAP, LONG_NAP].

    While every peer rings a doorbell after it sends, a nap is DOORBELL_NAP, cut short by
    the ring, even right after an active round (a message that came during the round has
    rung: the wait returns at once). A ring whose message the round did not find starts a
    chase, naps from MIN_NAP doubling up to CHASE_LAST: a message can leave its sender after
    the ring (Open MPI's TCP transport writes it out in a later progress call of the
    sender's), and arrives within a few ms while the sender polls; the schedule's slower
    growth took 17 wake-ups to cover that span, the chase 7. Sends of our own in flight put
    the loop on the schedule: they progress only when we call MPI, and a peer may wait for
    them with nothing to ring for.
    """

    def __init__(self) -> None:
        self.round_trips: deque[float] = deque(maxlen=ROUND_TRIP_WINDOW)
        self.first = MIN_NAP
        self.current = MIN_NAP
        self.doorbell = False
        self.chase = 0.0  # the next nap of a chase after a ring, 0 when not chasing

    def observe_round_trip(self, seconds: float) -> None:
        self.round_trips.append(seconds)
        typical = statistics.median(self.round_trips)
        self.first = min(max(LATENCY_SHARE * typical, MIN_NAP), LONG_NAP)

    def after(self, active: bool, rang: bool = False, sending: bool = False) -> float:
        """The nap to take now. `rang`: the nap before this round ended with a ring;
        `sending`: sends of ours are in flight."""
        bell = self.doorbell and not sending
        if active:
            self.current = self.first
            self.chase = 0.0
            return DOORBELL_NAP if bell else 0.0
        if not bell:
            nap = self.current
            self.current = min(nap * NAP_GROWTH, max(self.first, MAX_NAP))
            return nap
        if rang:
            self.chase = MIN_NAP
        nap = self.chase
        if not nap:
            return DOORBELL_NAP
        self.chase = nap * CHASE_GROWTH if nap < CHASE_LAST else 0.0
        return nap


class RankFailure(Exception):
    """A peer died or the communicator was revoked (ULFM error classes): this generation of
    the job is over. `revoked`: the communicator was revoked (by us or by a survivor)."""

    def __init__(self, error: MPI.Exception):
        self.error_class = error.Get_error_class()
        self.revoked = self.error_class == MPI.ERR_REVOKED
        super().__init__(error.Get_error_string())


_FAILURE_CLASSES = frozenset(
    getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    if hasattr(MPI, name))


class _FailuresRaised:
    """Turn the MPI errors of a failed peer or a revoked communicator into RankFailure. A
    class, not a @contextmanager generator: the master enters it several times per round."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is not None and issubclass(kind, MPI.Exception) \
                and error.Get_error_class() in _FAILURE_CLASSES:
            raise RankFailure(error) from None
        return False


_FAILURES_RAISED = _FailuresRaised()


def failures_raised() -> _FailuresRaised:
    return _FAILURES_RAISED


@dataclass(frozen=True)
class Incoming:
    source: int
    tag: int
    message: msgspec.Struct | None  # None when the bytes were malformed
    error: str = ""
    field: ResultField | None = None  # of a malformed RESULT: the field at fault


class Channel:
    def __init__(self, comm: MPI.Comm, *, max_nap: float = MAX_NAP):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.max_nap = max_nap
        self._status = MPI.Status()
        self._sending: list[tuple[MPI.Request, bytes]] = []  # the buffer outlives the send
        self._doorbells: dict[int, Ringer] = {}

    def ring_after_sends(self, dest: int, ringer: Ringer) -> None:
        """Ring `dest`'s doorbell after each message to it (doorbell.py)."""
        self._doorbells[dest] = ringer

    def send(self, dest: int, tag: Tag, message: msgspec.Struct, *, ring: bool = True) -> None:
        """`ring=False`: the sender's next message to `dest` follows at once and rings for
        both (a worker's RESULT, then its READY), so `dest` wakes once for the pair."""
        payload = encode(message)
        with failures_raised():
            request = self.comm.Isend([payload, MPI.BYTE], dest=dest, tag=int(tag))
            if not request.Test():
                self._sending.append((request, payload))
        if ring and dest in self._doorbells:  # after the send: a ring must not precede its message
            self._doorbells[dest].ring()

    @property
    def sending(self) -> bool:
        """Whether sends of ours are in flight (they progress only in our MPI calls)."""
        return bool(self._sending)

    def _progress_sends(self) -> None:
        if self._sending:
            with failures_raised():
                self._sending = [(r, p) for r, p in self._sending if not r.Test()]

    def send_raw(self, dest: int, tag: Tag, payload: bytes) -> None:
        """Bytes that are no envelope (fault injection: what a hostile worker sends)."""
        with failures_raised():
            self.comm.Send([payload, MPI.BYTE], dest=dest, tag=int(tag))

    def check_peers(self, known: Collection[int] = ()) -> None:
        """Raise RankFailure if MPI knows of a dead rank in this communicator (ULFM) other
        than those `known`: a probe for messages does not report a peer that died with
        nothing pending."""
        with failures_raised():
            failed = self.comm.Get_failed()
        try:
            if failed.Get_size() > len(known):
                raise RankFailure(MPI.Exception(MPI.ERR_PROC_FAILED))
        finally:
            failed.Free()

    def failed_ranks(self) -> set[int]:
        """The ranks of this communicator MPI knows dead, acknowledged: a receive from any
        source works again (ULFM fails it while a failure is not acknowledged)."""
        with failures_raised():
            self.comm.Ack_failed()
            failed = self.comm.Get_failed()
        group = self.comm.Get_group()
        try:
            return set(failed.Translate_ranks(list(range(failed.Get_size())), group))
        finally:
            group.Free()
            failed.Free()

    def check_master(self, master: int) -> None:
        """Raise RankFailure if `master` is dead or this communicator was revoked; a message
        waiting from it stays waiting."""
        with failures_raised():
            self.comm.Iprobe(master, MPI.ANY_TAG)

    def abandon_sends(self) -> None:
        """Forget the sends in flight: their communicator is revoked, they never complete."""
        self._sending.clear()

    def flush(self, timeout: float) -> bool:
        """Complete the sends still in flight; False if they did not within `timeout`."""
        deadline = SYSTEM_CLOCK.monotonic() + timeout
        nap = MIN_NAP
        while self._sending:
            self._progress_sends()
            if SYSTEM_CLOCK.monotonic() >= deadline:
                return not self._sending
            SYSTEM_CLOCK.sleep(nap)
            nap = min(nap * NAP_GROWTH, self.max_nap)
        return True

    def poll(self, source: int = MPI.ANY_SOURCE) -> Incoming | None:
        """Receive one pending message from `source` (anyone), if there is one. Under ULFM
        a receive from anyone fails while a death in the communicator is unacknowledged; one
        from a rank that lives does not."""
        self._progress_sends()
        with failures_raised():
            # A second probe at once, for a message the first one's progress took in: in
            # toml campaigns a lone probe after a ring found the message rung for 6% of the
            # time, and each miss cost the master a wake-up or more.
            if not self.comm.Iprobe(source, MPI.ANY_TAG, self._status) \
                    and not self.comm.Iprobe(source, MPI.ANY_TAG, self._status):
                return None
            source, tag = self._status.Get_source(), self._status.Get_tag()
            buffer = bytearray(self._status.Get_count(MPI.BYTE))
            self.comm.Recv([buffer, MPI.BYTE], source=source, tag=tag)
        try:
            return Incoming(source, tag, decode(tag, buffer))
        except MalformedMessage as error:
            return Incoming(source, tag, None, str(error), error.field)

    def wait_sends(self, keep: int, ring: int | None = None) -> None:
        """Progress the sends in flight until at most `keep` are left (a worker sending a
        large pack holds that many pieces in memory at most); if it waits, `ring`'s
        doorbell is rung first, for the receiver to take them."""
        nap = MIN_NAP
        if len(self._sending) > keep and ring in self._doorbells:
            self._doorbells[ring].ring()
        while len(self._sending) > keep:
            self._progress_sends()
            if len(self._sending) > keep:
                SYSTEM_CLOCK.sleep(nap)
                nap = min(nap * NAP_GROWTH, self.max_nap)

    def wait(self, deadline: float | None = None,
             source: int = MPI.ANY_SOURCE) -> Incoming | None:
        """Poll until a message arrives or the monotonic deadline passes."""
        nap = MIN_NAP
        while True:
            incoming = self.poll(source)
            if incoming is not None:
                return incoming
            if deadline is not None and SYSTEM_CLOCK.monotonic() >= deadline:
                return None
            SYSTEM_CLOCK.sleep(nap)
            nap = min(nap * NAP_GROWTH, self.max_nap)
