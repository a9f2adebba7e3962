"""Running real campaigns through the CLI and reading what they left."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import done_journals

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def explore_command(out: Path, args) -> list[str]:
    return [sys.executable, "-m", "symcc_mpi", "explore", "--out", str(out), "--no-live",
            *map(str, args)]


def explore(out: Path, *args, env: dict | None = None, timeout: float = 300):
    return subprocess.run(explore_command(out, args), capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def start_explore(out: Path, *args, analysed: int, seconds: float = 120) -> subprocess.Popen:
    """Launch a campaign in the background; return once `analysed` inputs are done. Fail
    (the job stopped first, with its output) if the campaign ended before or if `seconds`
    passed: a test that goes on would check a campaign that had not done that work."""
    launcher = subprocess.Popen(explore_command(out, args), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    what = f"{analysed} inputs analysed in {out}"
    deadline = time.monotonic() + seconds
    while True:
        ended = launcher.poll() is not None  # before the count: an end after it is seen next
        if (out / "state" / "done.jsonl").exists() and len(done_digests(out)) >= analysed:
            return launcher
        if ended:
            pytest.fail(f"the campaign ended (exit {launcher.returncode}) before {what}:\n"
                        f"{launcher.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds:g} s: {what}:\n{_stopped(launcher)[-3000:]}")
        time.sleep(0.1)


def _stopped(launcher: subprocess.Popen) -> str:
    """End the campaign (SIGTERM ends the launcher's whole job; SIGKILL if that hangs too),
    and return its output."""
    launcher.send_signal(signal.SIGTERM)
    try:
        return launcher.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        launcher.kill()
        return launcher.communicate()[0]


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


def done_digests(out: Path) -> list[str]:
    """The inputs every master's done journal names, read-only (a torn last line is left
    alone); an input twice in the list was analysed twice."""
    campaign = CampaignDir(out)
    return [record["digest"] for path in done_journals(out)
            for record in campaign.inspect_journal(path)[0] if "kind" not in record]


def done_keys(out: Path) -> list[tuple[str, int]]:
    """(input, epoch) of every done record: each epoch analyses the corpus again (tiers/)."""
    campaign = CampaignDir(out)
    return [(record["digest"], record.get("epoch", 0)) for path in done_journals(out)
            for record in campaign.inspect_journal(path)[0] if "kind" not in record]


def crash_files(out: Path) -> list[Path]:
    return sorted(p for p in (out / "crashes").iterdir() if p.name.startswith("id:"))


def assert_oracles(out: Path, process: subprocess.CompletedProcess) -> None:
    assert process.returncode == 0, process.stdout + process.stderr
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    done = done_keys(out)
    assert len(done) == len(set(done)), "an input was analysed twice in an epoch"
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


# -- hybrid campaigns beside real AFL++ (afl_sync.py) ------------------------------------------

AFL_ENV = {"AFL_NO_UI": "1", "AFL_SKIP_CPUFREQ": "1", "AFL_NO_AFFINITY": "1",
           "AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES": "1"}


@contextlib.contextmanager
def afl_fleet(sync_dir: Path, afl_build: Path, seeds: Path, roles=("-M main", "-S sec")):
    """afl-fuzz instances (Debian's afl++) on `afl_build`, writing under `sync_dir`; each in
    its own process group, killed on the way out."""
    if shutil.which("afl-fuzz") is None:
        pytest.skip("afl-fuzz is not installed (make test installs Debian's afl++)")
    fuzzers = []
    try:
        for role in roles:
            flag, name = role.split()
            log = open(sync_dir.parent / f"afl-{name}.log", "wb")
            fuzzers.append(subprocess.Popen(
                ["afl-fuzz", flag, name, "-i", str(seeds), "-o", str(sync_dir), "--",
                 str(afl_build), "@@"], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **AFL_ENV}))
            log.close()
        yield fuzzers
    finally:
        for fuzzer in fuzzers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(fuzzer.pid, signal.SIGKILL)
            fuzzer.wait()


def start_hybrid(sync_dir: Path, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "symcc_mpi", "explore", "--afl-sync", str(sync_dir), "--no-live",
         *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=ROOT)


def queue_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("id:")) \
        if directory.is_dir() else []


def wait_until(condition, seconds: float, what: str, process=None, output=None) -> None:
    """Poll `condition` until it holds; fail naming `what` after `seconds` (or when
    `process` ended first). `output()` is the campaign's output so far, for the failure
    (without it: what `process` wrote to its pipe, once it ended)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if process is not None and process.poll() is not None:
            shown = output() if output else process.stdout.read()
            pytest.fail(f"the campaign ended before {what}: {shown}")
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds:g} s: {what}" + (f": {output()}" if output else ""))
        time.sleep(0.5)


def hybrid_beside_afl(sync_dir: Path, *, executor: str, target: Path, afl_build: Path,
                      seeds: Path, seconds: float = 240) -> tuple[subprocess.Popen, str]:
    """A 2-worker hybrid campaign beside `afl-fuzz -M main` and `-S sec`, stopped with
    Ctrl-C once each side took something from the other and the pair found a crash.
    Returns the finished launcher and its output; the fuzzers are gone by then."""
    ours = sync_dir / "symcc-mpi"
    with afl_fleet(sync_dir, afl_build, seeds):
        launcher = start_hybrid(sync_dir, "--executor", executor, "--target", f"{target} @@",
                                "--afl-target", f"{afl_build} @@", "--workers", 2,
                                "--wall-timeout", seconds + 60)
        try:
            wait_until(lambda: any(",sync:main," in n for n in queue_names(ours / "queue")),
                       seconds, "symcc-mpi imported main's queue", launcher)
            wait_until(lambda: queue_names(ours / "crashes"), seconds,
                       "the planted crash was found", launcher)
            wait_until(lambda: any(",sync:symcc-mpi," in n
                                   for n in queue_names(sync_dir / "main" / "queue")),
                       seconds, "afl-fuzz -M main imported symcc-mpi's queue", launcher)
        finally:
            launcher.send_signal(signal.SIGINT)
            output, _ = launcher.communicate(timeout=120)
    return launcher, output
