"""Which content-addressed objects each worker holds: WORK ships only missing ones (F313 §3.5).

An object's id is the SHA-256 of its bytes. `plan()` decides, before the send, which objects
a WORK must carry in full (those the worker is not known to hold) and loads them (the CAS
import may happen before the send); `confirm()` records them as held, and must be called only
after the send *returned* (F313 D7). The old code added the ids before the send: a failed send
then left the master believing the worker had objects it never received, and the next WORK
omitted their content. Here a plan that is never confirmed changes nothing, so the next
dispatch ships the full content again.

Mistakes only in the safe direction: a worker may hold an object the cache does not know of
(an ambiguous send that did deliver), never the reverse.

Both sides keep only the last `OBJECT_CACHE_CAPACITY` objects shipped, first in first out,
so neither grows with the corpus. The windows agree because a worker receives exactly the
confirmed shipments, in order, plus those of sends that raised; after any send that raised,
the coordinator `forget`s the rank, so its window restarts empty and stays a suffix of the
worker's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from symcc_mpi.dispatch.transaction import DispatchError

OBJECT_CACHE_CAPACITY = 256  # objects per worker; the worker's store keeps as many


class ObjectMismatch(DispatchError):
    """Loaded bytes whose SHA-256 is not the object id they were loaded for."""


@dataclass(frozen=True)
class TransferPlan:
    worker: int
    digests: tuple[str, ...]  # every object the WORK refers to, in the caller's order
    contents: Mapping[str, bytes] = field(default_factory=dict)  # only what must be shipped

    @property
    def hits(self) -> int:
        return len(self.digests) - len(self.contents)


@dataclass(frozen=True)
class ObjectCacheStatistics:
    workers: int
    plans: int
    confirmed: int
    shipped_objects: int  # confirmed transfers only
    shipped_bytes: int
    hits: int  # objects a confirmed plan did not need to ship


class ObjectTransferCache:
    def __init__(self, capacity: int = OBJECT_CACHE_CAPACITY) -> None:
        self.capacity = capacity
        self._held: dict[int, dict[str, None]] = {}  # insertion-ordered: oldest first
        self._plans = 0
        self._confirmed = 0
        self._shipped_objects = 0
        self._shipped_bytes = 0
        self._hits = 0

    def knows(self, worker: int, digest: str) -> bool:
        return digest in self._held.get(worker, ())

    def held(self, worker: int) -> frozenset[str]:
        return frozenset(self._held.get(worker, ()))

    def plan(self, worker: int, digests: Iterable[str],
             load: Callable[[str], bytes]) -> TransferPlan:
        """Load the objects `worker` lacks, each checked against its id. Changes nothing."""
        ids = tuple(dict.fromkeys(digests))
        held = self._held.get(worker, {})
        contents: dict[str, bytes] = {}
        for digest in ids:
            if digest in held:
                continue
            data = bytes(load(digest))
            if hashlib.sha256(data).hexdigest() != digest:
                raise ObjectMismatch(f"object {digest[:12]}: loaded bytes have another hash")
            contents[digest] = data
        self._plans += 1
        return TransferPlan(worker, ids, MappingProxyType(contents))

    def confirm(self, plan: TransferPlan) -> None:
        """The WORK carrying `plan` was sent (the send returned): the worker now holds its
        objects (F313 D7). Never call this before the send, nor after a failed one."""
        held = self._held.setdefault(plan.worker, {})
        for digest in plan.contents:  # a hit is not received again: its age stays
            held[digest] = None
        while len(held) > self.capacity:
            del held[next(iter(held))]
        self._confirmed += 1
        self._shipped_objects += len(plan.contents)
        self._shipped_bytes += sum(len(data) for data in plan.contents.values())
        self._hits += plan.hits

    def forget(self, worker: int) -> None:
        """The worker may have lost its cache (restarted, replaced): ship everything again."""
        self._held.pop(worker, None)

    def forget_all(self) -> None:
        """Ranks are numbered anew (ulfm/): nobody is known to hold anything."""
        self._held.clear()

    def statistics(self) -> ObjectCacheStatistics:
        return ObjectCacheStatistics(len(self._held), self._plans, self._confirmed,
                                     self._shipped_objects, self._shipped_bytes, self._hits)


class ObjectStore:
    """The objects this worker received, the last OBJECT_CACHE_CAPACITY of them: the window
    the master's ObjectTransferCache believes it holds (the cache above)."""

    def __init__(self, directory: Path, capacity: int = OBJECT_CACHE_CAPACITY):
        self.directory = directory
        self.capacity = capacity
        self.held: dict[str, None] = {}  # insertion-ordered: oldest first
        directory.mkdir()

    def put(self, digest: str, content: bytes) -> None:
        (self.directory / digest).write_bytes(content)
        self.held.pop(digest, None)  # received again: as young as the master thinks
        self.held[digest] = None
        while len(self.held) > self.capacity:
            oldest = next(iter(self.held))
            del self.held[oldest]
            (self.directory / oldest).unlink(missing_ok=True)

    def get(self, digest: str) -> bytes:
        return (self.directory / digest).read_bytes()
