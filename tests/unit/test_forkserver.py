"""The coverage probe (forkserver.py) on real AFL builds: the coverage afl-showmap reports,
the hit counts it loses, crashes, hangs, a forkserver that dies, targets it refuses."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from showmap_oracle import showmap

from symcc_mpi.coverage.edges import AflTargetError, Novelty, Status, TriageError
from symcc_mpi.coverage.forkserver import ForkserverProbe
from symcc_mpi.coverage.triage import CoverageMap

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUILD = EXAMPLES / "build"
HAVE_AFL = shutil.which("afl-clang-fast") is not None and shutil.which("afl-showmap") is not None
pytestmark = [pytest.mark.skipif(not HAVE_AFL, reason="afl-clang-fast / afl-showmap not "
                                 "installed (Debian package afl++)"), pytest.mark.timeout(120)]

# Crashes on "CRASH", aborts on "ABRT", spins for ever on "HANG", exits at once on "EXIT";
# a loop runs as many times as the first byte says ('0'..'9', 'x' for 200).
TARGET_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
  char buf[512] = {0};
  FILE *f = argc > 1 ? fopen(argv[1], "rb") : stdin;
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  if (n >= 5 && memcmp(buf, "CRASH", 5) == 0) { volatile int *p = 0; *p = 1; }
  if (n >= 4 && memcmp(buf, "ABRT", 4) == 0) abort();
  if (n >= 4 && memcmp(buf, "HANG", 4) == 0) { for (;;) {} }
  int loops = buf[0] == 'x' ? 200 : buf[0] >= '0' && buf[0] <= '9' ? buf[0] - '0' : 0;
  volatile int sum = 0;
  for (int i = 0; i < loops; i++) sum += i;
  if (n > 1 && buf[1] == 'y') puts("y");
  return 0;
}
"""


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("afl-target")
    (build / "target.c").write_text(TARGET_C)
    subprocess.run(["afl-clang-fast", "-O0", "-o", str(build / "target"),
                    str(build / "target.c")], check=True, capture_output=True,
                   env={**os.environ, "AFL_QUIET": "1"})
    return build / "target"


@pytest.fixture(scope="module")
def examples():
    subprocess.run(["make", "-s", "-C", str(EXAMPLES)], check=True)
    return BUILD


def mutations(seeds: list[bytes], count: int, rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("name", ["json", "ini", "tlv", "magic", "checksum"])
@pytest.mark.parametrize("mode", ["@@", "stdin"])
def test_every_edge_and_class_afl_showmap_reports_is_reported(examples, tmp_path, name, mode):
    """afl-showmap is the oracle, with one known flaw: AFL++ 4.04c prints its maps through
    count_class_human, which has no class for hit counts 5-7, 9-15, 17-31, 33-127 and
    129-255, so it leaves out edges the probe (afl-fuzz's classes) reports."""
    seeds = [path.read_bytes() for path in sorted((EXAMPLES / "seeds" / name).iterdir())]
    inputs = seeds + mutations(seeds, 25, random.Random(name))
    files = []
    for number, data in enumerate(inputs):
        files.append(tmp_path / f"{number:04d}")
        files[-1].write_bytes(data)
    argv = [str(examples / f"{name}.afl")] + (["@@"] if mode == "@@" else [])
    expected = showmap(argv, files)
    with ForkserverProbe(argv, timeout=5) as probe:
        got = probe.probe(files)
    for oracle, coverage in zip(expected, got, strict=True):
        reported = dict(coverage.pairs())
        assert all(reported.get(index) == bit for index, bit in oracle.pairs())
        assert coverage.map_size == probe.map_size > 0
    assert probe.stats.starts == 1 and probe.stats.files == len(files)


def test_hit_counts_afl_showmap_loses_are_kept_in_afl_fuzz_classes(target, tmp_path):
    with ForkserverProbe([str(target), "@@"], timeout=5) as probe:
        maps = {count: dict(probe.probe_bytes(count.encode()).pairs())
                for count in "0123456789x"}
    (body,) = set(maps["1"]) - set(maps["0"])  # the loop body's edge, hit `count` times
    # In the classes of afl-fuzz's count_class_binary.
    assert [maps[count][body] for count in "123456789x"] == \
        [1, 2, 4, 8, 8, 8, 8, 16, 16, 128]
    (tmp_path / "five").write_bytes(b"5")
    (tmp_path / "four").write_bytes(b"4")
    five, four = showmap([str(target), "@@"], [tmp_path / "five", tmp_path / "four"])
    assert len(five.pairs()) < len(four.pairs())  # afl-showmap drops the edge hit 5 times


def test_crashes_and_hangs_and_the_inputs_after_them(target):
    # "HANG" spins for ever, so the timeout may be far above what the other runs take on a
    # busy machine: a run that ends is then never taken for a hang.
    with ForkserverProbe([str(target)], timeout=2.0) as probe:
        statuses = [probe.probe_bytes(data).status for data in
                    (b"1", b"CRASH", b"2y", b"ABRT", b"HANG", b"3", b"")]
        assert statuses == [Status.OK, Status.CRASH, Status.OK, Status.CRASH, Status.HANG,
                            Status.OK, Status.OK]
        assert (probe.stats.crashes, probe.stats.hangs, probe.stats.starts) == (2, 1, 1)
        assert probe.probe_bytes(b"2y").pairs() == probe.probe_bytes(b"2y").pairs()


def test_a_forkserver_killed_from_outside_is_started_again(target):
    with ForkserverProbe([str(target), "@@"], timeout=5) as probe:
        before = probe.probe_bytes(b"3y")
        os.killpg(probe._process.pid, signal.SIGKILL)
        assert probe.probe_bytes(b"3y") == before
        assert probe.stats.starts == 2


def test_hit_counts_reach_the_master(target):
    with ForkserverProbe([str(target), "@@"], timeout=5) as probe:
        covs = [probe.probe_bytes(data) for data in (b"2", b"9y", b"9y", b"3")]
    cmap = CoverageMap()
    novelty = [cmap.merge_novelty(c) for c in covs]
    assert novelty == [Novelty.NEW_EDGE, Novelty.NEW_EDGE, Novelty.NONE, Novelty.NEW_COUNT]


def test_a_target_without_a_forkserver_is_refused_in_one_line(examples, tmp_path):
    plain = examples / "json"  # gcc -O0: no AFL runtime
    with ForkserverProbe([str(plain), "@@"], timeout=1) as probe:
        with pytest.raises(AflTargetError, match="never reached its forkserver") as refused:
            probe.probe_bytes(b"{}")
    assert "\n" not in str(refused.value)
    with ForkserverProbe([str(tmp_path / "missing"), "@@"], timeout=1) as probe:
        with pytest.raises(TriageError, match="missing"):
            probe.probe_bytes(b"{}")


# Appends, to the file its second argument names, the directory it runs in and its TMPDIR.
WHERE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
  char cwd[4096];
  const char *tmp = getenv("TMPDIR");
  FILE *record = fopen(argv[2], "a");
  if (!record || !getcwd(cwd, sizeof cwd)) return 1;
  fprintf(record, "%s %s\n", cwd, tmp ? tmp : "-");
  return 0;
}
"""


def test_the_afl_build_runs_in_the_probes_scratch_not_in_our_directory(tmp_path, monkeypatch):
    """On a cluster our directory is a shared one: nothing of the probe's goes there, and a
    relative argument still names the same file; close removes what the probe made."""
    where = tmp_path / "where"
    (tmp_path / "where.c").write_text(WHERE_C)
    subprocess.run(["afl-clang-fast", "-O0", "-o", str(where), str(tmp_path / "where.c")],
                   check=True, capture_output=True, env={**os.environ, "AFL_QUIET": "1"})
    ours, scratch = tmp_path / "ours", tmp_path / "scratch"
    ours.mkdir()
    scratch.mkdir()
    monkeypatch.chdir(ours)
    Path("record.txt").touch()
    probe = ForkserverProbe([str(where), "@@", "record.txt"], timeout=1, scratch_dir=scratch)
    assert [probe.probe_bytes(data).status for data in (b"a", b"bb", b"")] == [Status.OK] * 3
    runs = [line.split(" ") for line in (ours / "record.txt").read_text().splitlines()]
    assert len(runs) == 3
    for cwd, tmpdir in runs:
        assert Path(cwd).parent == scratch and Path(cwd).name.startswith("symcc-mpi-probe-")
        assert tmpdir == cwd
    probe.close()
    probe.close()  # twice: nothing happens
    assert os.listdir(ours) == ["record.txt"]
    assert os.listdir(scratch) == []
