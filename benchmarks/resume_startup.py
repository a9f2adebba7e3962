"""Resume start-up: from `explore --resume` to the first WORK, on a large synthetic campaign.

A campaign directory with N corpus inputs (queue/ entries as hard links, as a campaign
leaves them) of which half are in the done journal is built once; then `--resume` runs it
with the no-op executor and `stats.json`'s `startup_seconds` (command → first dispatch) is
read. The page cache is dropped first when we may (root), since a resumed campaign usually
starts cold. Target: under 5 s for 100,000 inputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _campaign import print_table, run_campaign

from symcc_mpi.corpus import CampaignDir
from symcc_mpi.durable.journal import encode_line
from symcc_mpi.report import afl_queue_name

TARGET_SECONDS = 5.0


def build_campaign(out: Path, inputs: int) -> None:
    """What a campaign of `inputs` inputs leaves on disk, written directly (fast)."""
    campaign = CampaignDir(out)
    campaign.create({"synthetic": True})
    done = open(campaign.done_journal, "wb")
    for i in range(inputs):
        data = f"synthetic input {i}\n".encode() + os.urandom(16)
        digest = hashlib.sha256(data).hexdigest()
        (campaign.corpus / digest).write_bytes(data)
        os.link(campaign.corpus / digest, campaign.queue / afl_queue_name(i, (max(i - 1, 0),)))
        if i % 2:
            done.write(encode_line({"sha256": digest, "token": "0" * 32, "outcome": "ok",
                                    "time": time.time()}))
    done.close()


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    true = "/bin/true"
    rows = []
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-resume-") as scratch:
        for inputs in args.inputs:
            out = Path(scratch, f"campaign-{inputs}")
            started = time.monotonic()
            build_campaign(out, inputs)
            built = time.monotonic() - started
            cold = drop_page_cache()
            stats = run_campaign(out, "--resume", "--executor", "noop", "--target", true,
                                 "--workers", "2", "--wall-timeout", "3")
            extra = stats["extra"]
            rows.append({"inputs": inputs, "done": inputs // 2, "cold_cache": cold,
                         "startup_seconds": extra["startup_seconds"],
                         "command_seconds": stats["command_seconds"],
                         "executions": stats["executions"],
                         "build_seconds": built})
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    largest = rows[-1]
    print(f"resume of {largest['inputs']:,} inputs: first WORK after "
          f"{largest['startup_seconds']:.2f} s (target < {TARGET_SECONDS:g} s)")
    print(json.dumps({"benchmark": "resume_startup", "target_seconds": TARGET_SECONDS,
                      "results": rows}))


if __name__ == "__main__":
    main()
