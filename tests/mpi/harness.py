"""Running real campaigns through the CLI and reading what they left."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from symcc_mpi.corpus import CampaignDir, done_journals

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _explore_command(out: Path, args) -> list[str]:
    return [sys.executable, "-m", "symcc_mpi", "explore", "--out", str(out), "--no-live",
            *map(str, args)]


def explore(out: Path, *args, env: dict | None = None, timeout: float = 300):
    return subprocess.run(_explore_command(out, args), capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def start_explore(out: Path, *args, analysed: int) -> subprocess.Popen:
    """Launch a campaign in the background; return once `analysed` inputs are done."""
    launcher = subprocess.Popen(_explore_command(out, args), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (out / "state" / "done.jsonl").exists() and len(done_hashes(out)) >= analysed:
            break
        time.sleep(0.1)
    return launcher


def rank_pid(out: Path, rank: int) -> int | None:
    """The pid of MPI rank `rank` of the campaign writing to `out`, from /proc."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            environ = open(f"/proc/{entry}/environ", "rb").read()
        except OSError:
            continue
        if str(out).encode() in cmdline and \
                f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ.split(b"\0"):
            return int(entry)
    return None


def verify(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "symcc_mpi", "verify", str(out)],
                          capture_output=True, text=True, timeout=120)


def stats(out: Path) -> dict:
    return json.loads((out / "stats.json").read_text())


def done_hashes(out: Path) -> list[str]:
    """The inputs every master's done journal names, read-only (a torn last line is left
    alone); an input twice in the list was analysed twice."""
    campaign = CampaignDir(out)
    return [record["sha256"] for path in done_journals(out)
            for record in campaign.inspect_journal(path)[0] if "kind" not in record]


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
    dispatch = stats(out)["extra"]["dispatch"]
    held = {table: dispatch[table] for table in ("preparing", "active", "committing")}
    assert not any(held.values()), f"dispatch transactions leaked: {held}"


def crashes_natively(binary: Path, data: bytes, tmp: Path) -> bool:
    probe = tmp / "crash-probe"
    probe.write_bytes(data)
    return subprocess.run([str(binary), str(probe)], capture_output=True,
                          timeout=10).returncode < 0
