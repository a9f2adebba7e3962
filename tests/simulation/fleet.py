"""The AFL++ instances beside a hybrid campaign (`--afl-sync AFL_OUT`, afl_sync.py): each
writes entries into its queue/ at drawn virtual times, as afl-fuzz does (in place, named
`id:N,...`, mtime the machine's clock), and takes copies of the campaign's own queue/
entries by its ordinary sync (`id:N,sync:symcc,src:M`): the campaign must import what is
new to it and recognise what it gave.

A fuzzer is not a rank: its files are written between turns, durable at once (a power
failure of the campaign's machines is not its).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.campaign import afl_sync
from symcc_mpi.campaign.afl_names import parse_afl_queue_id

CAMPAIGN_NAME = "symcc"  # the campaign's instance under AFL_OUT
# The fuzzers write from before the campaign starts (its first scan finds their entries) to
# WRITES_UNTIL virtual seconds into it.
WRITES_FROM, WRITES_UNTIL = -2.0, 1.0
# How often the campaign scans the fleet (afl_sync.SCAN_INTERVAL), a knob drawn per campaign:
# often, imports fall among the faults of the first virtual second.
SCAN_INTERVALS = (afl_sync.SCAN_INTERVAL, 0.25)
SYNC_SHARE = 0.3  # of the entries, copies of the campaign's queue/ (AFL's sync of it)


@dataclass(frozen=True)
class Entry:
    at: float  # virtual seconds since the campaign began (before it, if negative)
    instance: str
    data: bytes | None  # None: a copy of the campaign's queue/ entry found at `at`


class Fleet:
    """The fuzzers' planned entries, drawn from the schedule's seed alone."""

    def __init__(self, seed: int, sync_dir: Path):
        rng = random.Random(f"fleet-{seed}")
        self.sync_dir = sync_dir
        self.scan_interval = rng.choice(SCAN_INTERVALS)
        entries = []
        for instance in (f"fuzzer{n:02d}" for n in range(1, rng.choice((1, 1, 2)) + 1)):
            for _ in range(rng.randint(1, 12)):
                # Depth 0 and a value no seed has (seeds are [0, n, 0]): new to the campaign,
                # never a child, so never an input its triage set aside.
                data = None if rng.random() < SYNC_SHARE else \
                    bytes([0, rng.randrange(256), 1 + rng.randrange(4)])
                at = round(rng.uniform(WRITES_FROM, WRITES_UNTIL), 4)
                entries.append(Entry(at, instance, data))
        self.pending = sorted(entries, key=lambda e: e.at)
        self.written: list[Entry] = []
        self.next_id: dict[str, int] = {}
        self.copied: set[str] = set()  # the campaign's queue/ entries taken by sync

    def roots(self) -> list[bytes]:
        """The inputs the fuzzers give the campaign (their copies of its own are its own)."""
        return [entry.data for entry in self.pending + self.written if entry.data]

    def write_due(self, elapsed: float, wall_time: float) -> int:
        """Writes the entries due `elapsed` virtual seconds into the campaign, the machine's
        clock reading `wall_time`, each stamped with the time it was due; returns how many."""
        written = 0
        while self.pending and self.pending[0].at <= elapsed:
            entry = self.pending.pop(0)
            self.written.append(entry)
            data, name = entry.data, None
            if data is None:
                data, name = self._copy_of_the_campaigns()
                if data is None:
                    continue  # nothing of the campaign's to copy yet
            queue = self.sync_dir / entry.instance / "queue"
            queue.mkdir(parents=True, exist_ok=True)
            number = self.next_id.get(entry.instance, 0)
            self.next_id[entry.instance] = number + 1
            if name is None:
                name = f"id:{number:06d},time:0,execs:0,orig:seed{number}" if number == 0 else \
                    f"id:{number:06d},src:{number - 1:06d},time:{int(entry.at * 1000)}," \
                    f"execs:{number * 97},op:havoc,rep:2" + (",+cov" if number % 2 else "")
            else:
                name = f"id:{number:06d},{name}"
            path = queue / name
            path.write_bytes(data)
            made = wall_time - (elapsed - entry.at)
            os.utime(path, (made, made))
            written += 1
        return written

    def _copy_of_the_campaigns(self) -> tuple[bytes | None, str | None]:
        queue = self.sync_dir / CAMPAIGN_NAME / "queue"
        try:
            names = sorted(n for n in os.listdir(queue) if parse_afl_queue_id(n) is not None
                           and n not in self.copied)
        except FileNotFoundError:
            return None, None
        if not names:
            return None, None
        self.copied.add(names[0])
        return (queue / names[0]).read_bytes(), f"sync:{CAMPAIGN_NAME}," \
            f"src:{parse_afl_queue_id(names[0]):06d}"
