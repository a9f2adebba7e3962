"""Scaling: executions per second and time to the planted bug, 1 worker vs 2 workers.

The Triton executor on the TLV example, with AFL triage on (afl-showmap on the AFL build),
from a generated corpus of benign TLV seeds so that there is work for both workers from the
start. The rate is taken over the campaign's steady part (first to last analysed input in
the done journal), so start-up (mpiexec, the Triton server's import) is not counted.
Targets: 2 workers >= 1.7x the executions per second of 1; master under 5% of one core.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
from pathlib import Path

from _campaign import ROOT, print_table, run_campaign

from symcc_mpi.campaign.corpus import CampaignDir

SEEDS = 100
SPEEDUP_TARGET = 1.7
MASTER_SHARE_TARGET = 5.0


def tlv_seed(rng: random.Random) -> bytes:
    records = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice((1, 2, 3))
        if kind == 1:
            value = bytes(rng.randrange(32, 127) for _ in range(rng.randint(0, 32)))
        elif kind == 2:
            value = rng.randint(0, 1000).to_bytes(4, "little")
        else:
            value = bytes(rng.randrange(32, 127) for _ in range(rng.randint(0, 16)))
        records.append(bytes((kind, len(value))) + value)
    return b"TLV\x01" + b"".join(records) + b"\x00\x00"


def steady_rate(out: Path) -> float:
    times = [record["time"] for record in CampaignDir(out).read_done()]
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def main() -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT / "examples")], check=True)
    build = ROOT / "examples" / "build"
    rng = random.Random(320)
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-scaling-") as scratch:
        seeds = Path(scratch, "seeds")
        seeds.mkdir()
        for i in range(SEEDS):
            (seeds / f"seed{i:03d}").write_bytes(tlv_seed(rng))
        figures = []
        for workers in (1, 2):
            out = Path(scratch, f"out{workers}")
            stats = run_campaign(out, "--target", f"{build / 'tlv'} @@", "--afl-target",
                                 f"{build / 'tlv.afl'} @@", "--seeds", str(seeds),
                                 "--workers", str(workers), "--timeout", "20",
                                 "--wall-timeout", "600")
            extra = stats["extra"]
            figures.append({
                "workers": workers,
                "executions": stats["executions"],
                "execs_per_sec": steady_rate(out),
                "seconds_to_bug": extra["first_crash_seconds"],
                "crashes": stats["crashes"],
                "edges": stats["edges_found"],
                "campaign_seconds": extra["master_loop_seconds"],
                "master_cpu_percent": 100 * extra["master_loop_cpu_seconds"]
                / extra["master_loop_seconds"],
            })
    print_table(list(figures[0]), [list(f.values()) for f in figures])
    speedup = figures[1]["execs_per_sec"] / figures[0]["execs_per_sec"]
    master = max(f["master_cpu_percent"] for f in figures)
    print(f"speedup 2 vs 1 workers: {speedup:.2f}x (target >= {SPEEDUP_TARGET}x); "
          f"master CPU at most {master:.1f}% of a core (target < {MASTER_SHARE_TARGET}%)")
    print(json.dumps({"benchmark": "scaling", "speedup": speedup,
                      "speedup_target": SPEEDUP_TARGET, "master_cpu_percent_max": master,
                      "master_cpu_target": MASTER_SHARE_TARGET, "results": figures}))


if __name__ == "__main__":
    main()
