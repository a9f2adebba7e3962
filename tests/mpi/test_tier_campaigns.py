"""The tiers past the interesting frontier (tiers/) in real campaigns: what triage does not
keep is set aside, a campaign without a budget says so and stops, a resume with a budget
explores it, and a campaign whose lower tiers hold nothing stops with its frontier."""

from __future__ import annotations

import pytest
from harness import assert_oracles, done_keys, explore, stats

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]


def magic(build) -> tuple:
    return ("--target", f"{build / 'magic'} @@", "--afl-target", f"{build / 'magic.afl'} @@",
            "--workers", 2, "--timeout", 20)


def test_what_triage_drops_is_set_aside_then_explored_by_a_resume_with_a_budget(build,
                                                                               tmp_path):
    out = tmp_path / "out"
    first = explore(out, *magic(build), "--seeds", build.parent / "seeds" / "magic")
    assert_oracles(out, first)
    tiers = stats(out)["extra"]["tiers"]
    waiting = tiers["pool"]["pending"]
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert not tiers["enabled"] and waiting > 0 and tiers["per_tier"]["2"]["executions"] == 0
    assert f"{waiting:,} inputs triage did not keep are set aside in {out / 'aside'}: " \
           "explore them with --resume --wall-timeout SECONDS" in first.stdout, first.stdout
    assert any((out / "aside").iterdir())
    corpus = {p.name for p in (out / "corpus").iterdir()}

    # Triton solves what the pool's inputs offer, no pruning map to start afresh: the pool is
    # explored to its end (children it sets aside included), then the campaign stops with
    # all its tiers empty, long before the budget (the budget only enables the tiers).
    resumed = explore(out, *magic(build), "--resume", "--wall-timeout", 3600)
    assert_oracles(out, resumed)
    figures = stats(out)["extra"]
    assert figures["stop_reason"] == "frontier exhausted"
    tiers = figures["tiers"]
    assert tiers["enabled"] and tiers["epoch"] == 0
    assert tiers["pool"]["pending"] == 0 and tiers["pool"]["in_flight"] == 0
    assert tiers["per_tier"]["2"]["executions"] >= waiting
    assert tiers["per_tier"]["2"]["executions"] == tiers["pool"]["explored"]
    assert not any((out / "aside").iterdir())  # every pack gone with its last input
    assert corpus <= {p.name for p in (out / "corpus").iterdir()}
    from_pool = [key for key in done_keys(out) if key[0] not in corpus]
    assert len(from_pool) >= waiting  # analysed, not kept (or kept later: not in the corpus)


def test_without_triage_or_pruning_a_budget_changes_nothing(build, tmp_path):
    out = tmp_path / "out"
    process = explore(out, "--target", f"{build / 'magic'} @@", "--seeds",
                      build.parent / "seeds" / "magic", "--workers", 2, "--timeout", 20,
                      "--wall-timeout", 3600)
    assert_oracles(out, process)
    figures = stats(out)["extra"]
    assert figures["stop_reason"] == "frontier exhausted"
    assert not figures["tiers"]["enabled"] and figures["tiers"]["pool"] is None
