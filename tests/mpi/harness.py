"""Running real campaigns through the CLI and reading what they left."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def explore(out: Path, *args, env: dict | None = None, timeout: float = 300):
    command = [sys.executable, "-m", "symcc_mpi", "explore", "--out", str(out), "--no-live",
               *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def verify(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "symcc_mpi", "verify", str(out)],
                          capture_output=True, text=True, timeout=120)


def stats(out: Path) -> dict:
    return json.loads((out / "stats.json").read_text())


def done_hashes(out: Path) -> list[str]:
    lines = (out / "state" / "done.jsonl").read_text().splitlines()
    return [json.loads(line)["sha256"] for line in lines]


def crash_files(out: Path) -> list[Path]:
    return sorted(p for p in (out / "crashes").iterdir() if p.name.startswith("id:"))


def assert_oracles(out: Path, process: subprocess.CompletedProcess) -> None:
    assert process.returncode == 0, process.stdout + process.stderr
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    done = done_hashes(out)
    assert len(done) == len(set(done)), "an input was analysed twice"
    for path in (out / "corpus").iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    assert not any((out / ".staging").iterdir()), "staging left behind"


def crashes_natively(binary: Path, data: bytes, tmp: Path) -> bool:
    probe = tmp / "crash-probe"
    probe.write_bytes(data)
    return subprocess.run([str(binary), str(probe)], capture_output=True,
                          timeout=10).returncode < 0
