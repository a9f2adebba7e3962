"""What is left to analyse: every input known once, by the SHA-256 of its bytes; no I/O.

An input enters the frontier once, however often it is generated, and leaves it when taken
for a dispatch. A dispatch that never reached a worker puts it back exactly where it was; a
dispatch that failed after the send is requeued (or deferred) by `dispatch.ProtocolRecovery`,
in front, so a failing input is retried soon rather than after the whole frontier.

The frontier also holds the master's other per-input state (generated digests seen, depth,
AFL queue id, dispatches) in one `digests.DigestTable`: a campaign of a million inputs costs
tens of bytes per input, not the hundreds that sets and dicts of hex strings did. Digests
cross this API as 64-character lowercase hex strings, as everywhere else in the project.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass

from symcc_mpi.scheduling.digests import MAX_DEPTH, NO_QUEUE_ID, UINT32, DigestTable

# Flag bits of a table entry. An entry can exist with none of them: put_back, requeue,
# mark_done or set_depth of a digest never added make a row, as the sets they replace did.
KNOWN = 1  # added: in the corpus
DONE = 2  # analysed
SEEN = 4  # generated (kept or not), noted by `see`
_SENT_LOW, _SENT_HIGH = 8, 16  # dispatch count 0..3, two bits
_SENT_SHIFT = 3
ASIDE = 32  # generated, not kept by triage, set aside for a lower tier (tiers/pool.py)
RERUN = 64  # a corpus input analysed in an earlier epoch, to analyse again in this one
# An epoch's start (`begin_epoch`): nothing is done or sent in the new epoch yet, and every
# corpus input is to be analysed again.
_NEW_EPOCH = bytes((flags & ~(DONE | _SENT_LOW | _SENT_HIGH | RERUN))
                   | (RERUN if flags & KNOWN else 0) for flags in range(256))

_COMPACT_AT = 4096  # pending-queue entries consumed before the queue may be compacted


def _key(digest: str) -> bytes:
    """The raw digest of a hex string; only the canonical (lowercase) spelling is one."""
    try:
        key = bytes.fromhex(digest)
    except (TypeError, ValueError):
        key = b""
    if len(key) != 32 or key.hex() != digest:
        raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
    return key


def _lookup(digest: object) -> bytes | None:
    """`_key` for membership tests: anything that is not a digest is simply not there."""
    if not isinstance(digest, str) or len(digest) != 64:
        return None
    try:
        key = bytes.fromhex(digest)
    except ValueError:
        return None
    return key if key.hex() == digest else None


@dataclass(frozen=True)
class FrontierStatistics:
    known: int  # inputs added (the corpus)
    done: int  # inputs marked done
    pending: int  # waiting in the frontier (an input put back twice counts twice)
    seen: int  # distinct digests passed to `see`
    memory_bytes: int  # the frontier's buffers, spare capacity included


class Frontier:
    def __init__(self) -> None:
        self._table = DigestTable()
        # Pending entries, oldest first, as 4-byte entry numbers: no Python object per input.
        # `_head` is the next to take; the consumed prefix is cut off once it is half the
        # array. put_back/requeue go in front, which is rare: a small list, its end first.
        self._queue = array(UINT32)
        self._head = 0
        self._front: list[int] = []
        # Ranked order (`rank_by`): a heap of (key, arrival, entry) in place of the queue.
        self._rank: Callable[[str], tuple] | None = None
        self._ranked: list[tuple[tuple, int, int]] = []
        self._arrivals = itertools.count()
        # Tier 3 (tiers/): corpus inputs to analyse again in this epoch, in queue order;
        # not counted in `len` nor `pending`, which are the interesting frontier (tier 1).
        self._rerun = array(UINT32)
        self._rerun_head = 0
        self.pending = PendingView(self)
        self.known = FlagView(self._table, KNOWN)
        self.done = FlagView(self._table, DONE)
        # With several masters: whether an input is this master's to analyse. Another's is
        # known, not queued: dispatch would only drop it (federation/masters.py), and a
        # master that comes to own it (withdrawal.py) or takes its lease over requeues it.
        self.mine: Callable[[str], bool] | None = None

    # -- the frontier -------------------------------------------------------------------------

    def rank_by(self, key: Callable[[str], tuple]) -> None:
        """Take pending inputs in the order of `key(digest)`, smallest first (ties in the
        order they were added) instead of first come, first served; put back and requeued
        inputs still go first; inputs already pending are ranked too. Costs a Python tuple
        per pending input: for a hybrid campaign's AFL-ranked frontier (afl_sync.py), not for
        the millions of an exploration.
        """
        self._rank = key
        queued, self._queue, self._head = self._queue[self._head:], array(UINT32), 0
        for entry in queued:  # in arrival order: ties keep it
            heapq.heappush(self._ranked, (key(self._table.key(entry).hex()),
                                          next(self._arrivals), entry))

    def add(self, digest: str, *, done: bool = False) -> bool:
        """Make an input known; it joins the frontier unless already known or done, or
        another master's (`mine`). True if it was not known."""
        table = self._table
        entry, _ = table.add(_key(digest))
        if not table.set_flag(entry, KNOWN):
            return False
        if done:
            table.set_flag(entry, DONE)
        elif self.mine is not None and not self.mine(digest):
            pass  # another master's: known, not queued
        elif self._rank is not None:
            heapq.heappush(self._ranked, (self._rank(digest), next(self._arrivals), entry))
        else:
            self._queue.append(entry)
        return True

    def take(self) -> str:
        """The first pending input, out of the frontier; IndexError if there is none."""
        if self._front:
            entry = self._front.pop()
        elif self._ranked:
            entry = heapq.heappop(self._ranked)[2]
        else:
            queue, head = self._queue, self._head
            if head >= len(queue):
                raise IndexError("take from an empty frontier")
            entry = queue[head]
            head += 1
            if head == len(queue):
                del queue[:]
                head = 0
            elif head >= _COMPACT_AT and 2 * head >= len(queue):
                # One memmove per half-queue taken: O(1) amortised, and the array's
                # allocation shrinks with it.
                del queue[:head]
                head = 0
            self._head = head
        return self._table.key(entry).hex()

    def put_back(self, digest: str) -> None:
        """Undo a `take` whose dispatch never left: first in line again."""
        self._front.append(self._table.add(_key(digest))[0])

    def requeue(self, digest: str) -> None:
        """A dispatch of `digest` failed after its send; analyse it again, soon."""
        entry, _ = self._table.add(_key(digest))
        if not self._table.has(entry, DONE):
            self._front.append(entry)

    def reopen(self, digest: str) -> None:
        """An input added as done turns out not to be (a commit that could not be redone):
        it is analysed again, first."""
        entry, _ = self._table.add(_key(digest))
        if self._table.clear_flag(entry, DONE):
            self._front.append(entry)

    def mark_done(self, digest: str) -> None:
        self._table.set_flag(self._table.add(_key(digest))[0], DONE)

    def __len__(self) -> int:
        return len(self._front) + len(self._ranked) + len(self._queue) - self._head

    # -- snapshots (snapshot.py) -------------------------------------------------------------

    def dump(self) -> list[bytes]:
        return self._table.dump()

    def restore(self, parts: list[bytes]) -> None:
        """The state `dump` saved: the table, then the pending inputs in queue order (the
        interesting ones, then those to analyse again in this epoch)."""
        if len(self) or self.reruns_pending:
            raise ValueError("restore into a frontier with pending inputs")
        table = self._table = DigestTable.restore(parts)
        self.known = FlagView(table, KNOWN)
        self.done = FlagView(table, DONE)
        self.rebuild_pending()

    def rebuild_pending(self) -> None:
        """The pending inputs, in queue order, as the table's flags say: after a restore and
        the records that followed its snapshot (job/resume.py), nothing taken yet."""
        table = self._table
        self._front.clear()
        self._ranked.clear()
        self._queue, self._head = array(UINT32), 0
        self._rerun, self._rerun_head = array(UINT32), 0
        waiting = list(table.entries_with(KNOWN, without=DONE))
        waiting.sort(key=table.queue_id_or_last)
        for entry in waiting:
            if table.has(entry, RERUN):
                self._rerun.append(entry)
            elif self._rank is not None:
                digest = table.key(entry).hex()
                heapq.heappush(self._ranked, (self._rank(digest), next(self._arrivals), entry))
            else:
                self._queue.append(entry)

    # -- the lower tiers (tiers/) ------------------------------------------------------------

    def set_aside(self, digest: str) -> None:
        """A generated input the aside pool holds (it was seen, not kept)."""
        entry, _ = self._table.add(_key(digest))
        self._table.set_flag(entry, SEEN)
        self._table.set_flag(entry, ASIDE)

    def awaits_aside(self, digest: str) -> bool:
        """Set aside and not analysed in this epoch: pending in the aside pool."""
        entry = self._find(digest)
        flags = self._table.flags(entry) if entry >= 0 else 0
        return bool(flags & ASIDE) and not flags & DONE

    def tier_of(self, digest: str) -> int:
        """The tier an input is analysed in: 2 set aside, 3 analysed again (a corpus input of
        an earlier epoch), else 1 (the interesting frontier)."""
        entry = self._find(digest)
        flags = self._table.flags(entry) if entry >= 0 else 0
        return 2 if flags & ASIDE else 3 if flags & RERUN else 1

    def begin_epoch(self) -> int:
        """A new epoch: nothing is done in it yet, and every corpus input is to be analysed
        again, in queue order, after the interesting frontier. Returns how many."""
        table = self._table
        table.update_flags(_NEW_EPOCH)
        entries = sorted(table.entries_with(RERUN), key=table.queue_id_or_last)
        self._rerun = array(UINT32, entries)
        self._rerun_head = 0
        return len(entries)

    def add_rerun(self, digest: str) -> None:
        """A corpus input analysed in an earlier epoch, not yet in this one (resume)."""
        entry, _ = self._table.add(_key(digest))
        self._table.set_flag(entry, KNOWN)
        self._table.set_flag(entry, RERUN)
        self._rerun.append(entry)

    @property
    def reruns_pending(self) -> int:
        return len(self._rerun) - self._rerun_head

    def next_rerun(self) -> str | None:
        """The next input to analyse again, without taking it; None when there is none."""
        rerun, table = self._rerun, self._table
        while self._rerun_head < len(rerun) and table.has(rerun[self._rerun_head], DONE):
            self._rerun_head += 1  # analysed again already (it was in front, or pending)
        if self._rerun_head >= len(rerun):
            return None
        return table.key(rerun[self._rerun_head]).hex()

    def take_rerun(self) -> str:
        digest = self.next_rerun()
        if digest is None:
            raise IndexError("no input to analyse again")
        self._rerun_head += 1
        if self._rerun_head == len(self._rerun):
            self._rerun = array(UINT32)
            self._rerun_head = 0
        return digest

    # -- the master's other per-input state ------------------------------------------------

    def see(self, digest: str) -> bool:
        """Note a generated input; True only if it was never seen nor known before. A child
        that is not kept is remembered this way, at the cost of its table row alone."""
        table = self._table
        entry, _ = table.add(_key(digest))
        new = not table.flags(entry) & (SEEN | KNOWN)
        table.set_flag(entry, SEEN)
        return new

    def seen_before(self, digest: str) -> bool:
        """Whether `see` or `add` met this digest already; notes nothing."""
        key = _lookup(digest)
        entry = -1 if key is None else self._table.find(key)
        return entry >= 0 and bool(self._table.flags(entry) & (SEEN | KNOWN))

    def depth(self, digest: str) -> int | None:
        """Generations from a seed (AFL counts seeds as 1); None if never set."""
        entry = self._find(digest)
        return (self._table.depth(entry) or None) if entry >= 0 else None

    def set_depth(self, digest: str, depth: int) -> None:
        """Depths past 65535 are stored as 65535: a statistic, not worth a wider column."""
        if depth < 1:
            raise ValueError(f"a depth counts from 1, not {depth}")
        self._table.set_depth(self._table.add(_key(digest))[0], min(depth, MAX_DEPTH))

    def queue_id(self, digest: str) -> int | None:
        """The input's AFL queue id (id:NNNNNN), or None."""
        entry = self._find(digest)
        return self._table.queue_id(entry) if entry >= 0 else None

    def queued_from(self, first: int) -> list[str]:
        """The inputs whose AFL queue id is `first` or later, in queue order: one pass over
        the ids, not a lookup per input."""
        table = self._table
        return [table.key(entry).hex() for entry in table.entries_queued_from(first)]

    def set_queue_id(self, digest: str, queue_id: int | None) -> None:
        if queue_id is not None and not 0 <= queue_id < NO_QUEUE_ID:
            raise ValueError(f"queue id {queue_id} outside 0..{NO_QUEUE_ID - 1}")
        self._table.set_queue_id(self._table.add(_key(digest))[0], queue_id)

    def note_dispatch(self, digest: str) -> int:
        """Count a dispatch of `digest`; return 1 the first time, 2 the second, 3 on any later
        one. Two bits are enough: a caller only asks whether an input went out *again*, and
        `== 2` is true exactly once."""
        table = self._table
        entry, _ = table.add(_key(digest))
        sent = min(((table.flags(entry) >> _SENT_SHIFT) & 3) + 1, 3)
        for bit, flag in ((1, _SENT_LOW), (2, _SENT_HIGH)):
            if sent & bit:
                table.set_flag(entry, flag)
            else:
                table.clear_flag(entry, flag)
        return sent

    def memory_bytes(self) -> int:
        """The buffers the frontier holds: its table, pending queue and front list."""
        return (self._table.memory_bytes() + sys.getsizeof(self._queue)
                + sys.getsizeof(self._front) + sys.getsizeof(self._ranked)
                + sum(sys.getsizeof(item) + sys.getsizeof(item[0]) for item in self._ranked))

    def statistics(self) -> FrontierStatistics:
        table = self._table
        return FrontierStatistics(known=table.count(KNOWN), done=table.count(DONE),
                                  pending=len(self), seen=table.count(SEEN),
                                  memory_bytes=self.memory_bytes())

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"<Frontier known={s.known} done={s.done} pending={s.pending} seen={s.seen} "
                f"memory_bytes={s.memory_bytes}>")

    # -- machinery --------------------------------------------------------------------------

    def _find(self, digest: str) -> int:
        key = _lookup(digest)
        return -1 if key is None else self._table.find(key)

    def _pending_entries(self) -> list[int] | array:
        """Pending entries in order, copied: callers may take or add while iterating."""
        queue = self._queue[self._head:]
        if not self._front and not self._ranked:
            return queue
        ranked = [item[2] for item in sorted(self._ranked)]
        return self._front[::-1] + ranked + queue.tolist()

    def _pending_entry(self, position: int) -> int:
        front = self._front
        if position < len(front):
            return front[-1 - position]
        if self._ranked:
            if position == len(front):  # the next to take, as dispatch asks: the heap's top
                return self._ranked[0][2]
            return self._pending_entries()[position]
        return self._queue[self._head + position - len(front)]


class PendingView(Sequence):
    """The pending inputs in order, first in line first: read-only, `pending[0]` is next."""

    __slots__ = ("_frontier",)

    def __init__(self, frontier: Frontier) -> None:
        self._frontier = frontier

    def __len__(self) -> int:
        return len(self._frontier)

    def __getitem__(self, position):  # Sequence's signature: an int (no slices here)
        size = len(self._frontier)
        if not isinstance(position, int):
            raise TypeError("pending inputs are indexed by position only")
        if position < 0:
            position += size
        if not 0 <= position < size:
            raise IndexError("pending index out of range")
        return self._frontier._table.key(self._frontier._pending_entry(position)).hex()

    def __iter__(self) -> Iterator[str]:
        # The order is copied when iteration starts (4 bytes an entry), not when it ends.
        key, entries = self._frontier._table.key, self._frontier._pending_entries()
        return (key(entry).hex() for entry in entries)

    def head(self) -> Iterator[str]:
        """The pending inputs in order, made as they are asked for: a look at the first few
        of a big frontier costs a few, not a copy of its order. The frontier must not change
        while it runs."""
        frontier = self._frontier
        key = frontier._table.key
        for entry in reversed(frontier._front):
            yield key(entry).hex()
        ranked = frontier._ranked
        # The heap in order without sorting it: its smallest unseen items are the children
        # of those seen.
        candidates = [(ranked[0], 0)] if ranked else []
        while candidates:
            item, index = heapq.heappop(candidates)
            yield key(item[2]).hex()
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(ranked):
                    heapq.heappush(candidates, (ranked[child], child))
        queue = frontier._queue
        for position in range(frontier._head, len(queue)):
            yield key(queue[position]).hex()

    def __repr__(self) -> str:
        return f"PendingView({list(self)!r})"


class FlagView(Set):
    """The digests whose table entry has one flag (known, done): a read-only set that compares
    equal to a set of the same hex strings."""

    __slots__ = ("_table", "_flag")

    def __init__(self, table: DigestTable, flag: int) -> None:
        self._table = table
        self._flag = flag

    @classmethod
    def _from_iterable(cls, iterable: Iterable[str]) -> set[str]:
        # Set operators (done - other, done & other) build plain sets, not views.
        return set(iterable)

    def __contains__(self, digest: object) -> bool:
        key = _lookup(digest)
        if key is None:
            return False
        entry = self._table.find(key)
        return entry >= 0 and self._table.has(entry, self._flag)

    def __len__(self) -> int:
        return self._table.count(self._flag)

    def __iter__(self) -> Iterator[str]:
        key = self._table.key
        for entry in self._table.entries_with(self._flag):
            yield key(entry).hex()

    def __repr__(self) -> str:
        return f"FlagView({set(self)!r})"
