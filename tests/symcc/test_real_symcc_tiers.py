"""Epochs with a real SymCC (tiers/schedule.py): with a budget, a campaign whose frontier is
empty analyses its corpus again under a fresh QSYM map, and a resume goes on with the epoch
it was in. Each campaign is stopped by a stop request once it reached the state the test is
about (a test controls both sides of the race; the limits are only there to fail)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from harness import ROOT, assert_oracles, done_keys, stats, wait_until
from realsymcc import BUILD, SEEDS

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("afl-clang-fast") is None,
                                 reason="AFL++ not installed")]
COMMON = ("--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@", "--afl-target",
          f"{BUILD / 'json.afl'} @@", "--workers", "2", "--timeout", "20", "--no-live",
          "--wall-timeout", "3600")


def extra(out) -> dict:
    try:
        return json.loads((out / "stats.json").read_text())["extra"]
    except (OSError, ValueError, KeyError):
        return {}


def run_until(out, *args, condition, what: str):
    """The campaign, stopped once its own figures (not an earlier run's) meet `condition`."""
    earlier = extra(out).get("run_id")
    launcher = subprocess.Popen([sys.executable, "-m", "symcc_mpi", "explore", "--out",
                                 str(out), *COMMON, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)

    def reached() -> bool:
        figures = extra(out)
        return figures.get("run_id") not in (None, earlier) \
            and condition(figures.get("tiers") or {})

    try:
        wait_until(reached, 400, what, launcher)
    finally:
        (out / ".stop-request").touch()
        output, _ = launcher.communicate(timeout=120)
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, output, "")


def test_an_epoch_analyses_the_corpus_again_and_a_resume_goes_on_with_it(tmp_path):
    out = tmp_path / "out"
    first = run_until(out, "--seeds", str(SEEDS / "json"),
                      condition=lambda t: t.get("epoch", 0) >= 1
                      and t["per_tier"]["3"]["executions"] >= 3,
                      what="the campaign began an epoch and analysed again")
    assert_oracles(out, first)
    assert stats(out)["extra"]["stop_reason"] == "stop requested"
    assert "under a fresh QSYM map (tier 3)" in first.stdout
    journal = [json.loads(line[9:]) for line in (out / "state" / "done.jsonl").open("rb")]
    epochs = [record["epoch"] for record in journal if record.get("kind") == "epoch"]
    assert epochs and epochs == sorted(epochs)
    epoch = epochs[-1]
    again = {sha for sha, e in done_keys(out) if e == epoch}
    earlier = {sha for sha, e in done_keys(out) if e < epoch}
    assert again & earlier & {p.name for p in (out / "corpus").iterdir()}
    before = len(again)

    resumed = run_until(out, "--resume",
                        condition=lambda t: sum(f["executions"]
                                                for f in t["per_tier"].values()) >= 5,
                        what="the resumed campaign analysed five inputs")
    assert_oracles(out, resumed)
    tiers = stats(out)["extra"]["tiers"]
    assert tiers["epoch"] >= epoch  # it went on in the epoch it was in, or the next
    in_epoch = [sha for sha, e in done_keys(out) if e == epoch]
    assert len(in_epoch) == len(set(in_epoch)) >= before
