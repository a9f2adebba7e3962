"""Durable-layer throughput with fsync on, on this machine's disk: work lease cycles
(claim -> begin_commit -> complete), target group claims (sizes 1, 4, 16), QueryStore
dispatch+finish pairs and WAL commits. Target: >= 300 work cycles per second."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import bench_leases
import bench_stores

ROWS = [
    ("work claim->begin_commit->complete cycles/s", "work_cycles_per_s"),
    ("  ms per cycle", "work_ms_per_cycle"),
    ("  floor: 3 durable writes + 3 lock rounds, ms", "work_ms_per_cycle_floor"),
    ("target group claims/s, size 1", "group1_claims_per_s"),
    ("target group claims/s, size 4", "group4_claims_per_s"),
    ("target group claims/s, size 16", "group16_claims_per_s"),
    ("  records/s at size 16", "group16_records_per_s"),
    ("QueryStore dispatch+finish pairs/s", "querystore_pairs_per_sec"),
    ("  batched 16 pairs per transaction", "querystore_batched_pairs_per_sec"),
    ("WAL commits/s (begin, manifest, publish, done)", "wal_commits_per_sec"),
    ("  with 8 staged objects", "wal_8obj_commits_per_sec"),
    ("journal events/s", "journal_events_per_sec"),
    ("one durable write (write, fsync, replace, dir fsync), ms", "durable_write_ms"),
    ("batched: 16 records per syncfs, ms per record", "batched16_syncfs_ms_per_record"),
]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-durable-",
                                     dir=os.environ.get("BENCH_DIR")) as scratch:
        figures = bench_leases.measure(Path(scratch, "leases"))
        figures.update(bench_stores.measure(Path(scratch, "stores")))
    width = max(len(label) for label, _ in ROWS)
    for label, key in ROWS:
        value = figures.get(key)
        print(f"{label:<{width}}  {'n/a' if value is None else f'{value:10.2f}'}")
    verdict = "meets" if figures["work_cycles_per_s"] >= bench_leases.TARGET_CYCLES_PER_S \
        else "MISSES"
    print(f"target: >= {bench_leases.TARGET_CYCLES_PER_S:.0f} work cycles/s; {verdict} it")
    print(json.dumps({"benchmark": "durable_ops", "results": figures}))


if __name__ == "__main__":
    main()
