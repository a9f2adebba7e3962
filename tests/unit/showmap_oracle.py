"""afl-showmap as the test oracle of the coverage probe (forkserver.py): what AFL++'s own tool
says of the same inputs, run in batch mode and parsed from its text maps."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from symcc_mpi.coverage.edges import BUCKET_BITS, FileCoverage, Status

_CLASS_TO_BIT = {str(k + 1).encode(): bit for k, bit in enumerate(BUCKET_BITS)}


def parse_showmap_text(text: bytes) -> tuple[bytes, bytes]:
    """afl-showmap's "%06u:%u" lines (human classes 1..8) as FileCoverage's (edges, buckets)."""
    pairs = []
    for line in text.split(b"\n"):
        if not line:
            continue
        index, sep, cls = line.partition(b":")
        if not sep or not index.isdigit() or cls not in _CLASS_TO_BIT:
            raise ValueError(f"unexpected afl-showmap output line: {line[:60]!r}")
        pairs.append((int(index), _CLASS_TO_BIT[cls]))
    coverage = FileCoverage.from_pairs(pairs)
    return coverage.edges, coverage.buckets


def showmap(argv: list[str], files: list[Path], *, timeout_ms: int = 5000) -> list[FileCoverage]:
    """Each file's map as afl-showmap's batch mode writes it (status left OK: the oracle is
    for edges and classes). Zero-size files, which batch mode skips, get an empty map."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:
        in_dir, out_dir = Path(work, "in"), Path(work, "out")
        in_dir.mkdir()
        for number, path in enumerate(files):
            shutil.copyfile(path, in_dir / f"f{number:06d}")
        subprocess.run(["afl-showmap", "-i", "/" + str(in_dir), "-o", "/" + str(out_dir),
                        "-t", str(timeout_ms), "-m", "none", "--", *argv],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work,
                       env={**os.environ, "AFL_QUIET": "1"}, check=False)
        maps = []
        for number in range(len(files)):
            path = out_dir / f"f{number:06d}"
            edges, buckets = parse_showmap_text(path.read_bytes()) if path.exists() \
                else (b"", b"")
            maps.append(FileCoverage(Status.OK, edges, buckets))
        return maps
