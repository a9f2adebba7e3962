"""A target that plants links and a FIFO in its output directory (SYMCC_OUTPUT_DIR): under
real mpiexec with the SymCC executor, the campaign completes, `verify` is OK, and the bytes
behind the links (/etc/passwd, a file outside the campaign) never reach corpus/, queue/,
crashes/ or hangs/."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from harness import assert_oracles, done_digests, explore, stats

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

OUTSIDE = b"a file outside the campaign: its bytes must never be published\n"


def hostile_target(tmp_path: Path, outside: Path) -> Path:
    """Grows its input by one byte up to 4 bytes (a real, finite exploration), and every run
    also leaves a link to /etc/passwd, a link to `outside`, a FIFO and a directory."""
    target = tmp_path / "hostile-target"
    target.write_text(
        "#!/bin/sh\n"
        'data=$(cat "$1")\n'
        'cd "$SYMCC_OUTPUT_DIR" || exit 1\n'
        "ln -s /etc/passwd passwd\n"
        f"ln -s '{outside}' outside\n"
        "ln -s /dev/null null\n"
        "mkfifo fifo\n"
        "mkdir subdir\n"
        'if [ ${#data} -lt 4 ]; then printf "%sx" "$data" > 000000; fi\n')
    target.chmod(0o755)
    return target


def published(out: Path) -> list[Path]:
    return [path for name in ("corpus", "queue", "crashes", "hangs")
            for path in (out / name).iterdir()]


def test_links_and_fifos_a_target_leaves_are_never_followed(tmp_path):
    outside = tmp_path / "outside-secret"
    outside.write_bytes(OUTSIDE)
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "a").write_bytes(b"a")
    (seeds / "b").write_bytes(b"b")
    out = tmp_path / "out"
    process = explore(out, "--executor", "symcc", "--target",
                      f"{hostile_target(tmp_path, outside)} @@", "--seeds", seeds,
                      "--workers", 2, "--timeout", 20)
    assert_oracles(out, process)
    expected = {s + b"x" * n for s in (b"a", b"b") for n in range(4)}
    corpus = {path.read_bytes() for path in (out / "corpus").iterdir()}
    assert corpus == expected, process.stderr[-3000:]
    assert len(done_digests(out)) == len(expected)
    secrets = {OUTSIDE, Path("/etc/passwd").read_bytes()}
    for path in published(out):
        assert not path.is_symlink(), path
        assert path.read_bytes() not in secrets, path
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == "frontier exhausted"
    assert figures["extra"]["dispatch"]["invalid_results"] == 0
    digests = {hashlib.sha256(data).hexdigest() for data in expected}
    assert {path.name for path in (out / "corpus").iterdir()} == digests
    log = process.stdout + process.stderr
    assert "left a symlink in its output directory" in log
    assert "not regular files" in log
