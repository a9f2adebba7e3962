"""End-to-end oracles over a campaign directory (DESIGN §7)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .corpus import MARKER, CampaignDir, CampaignError, sha256_file
from .durable.journal import DEFERRED_JOURNAL_NAME, inspect


def verify_campaign(out: Path) -> tuple[list[str], dict]:
    """Return (problems, facts); no problem means every oracle holds.

    Read-only: nothing in OUT is written, so it may run against a live campaign. A torn last
    line of the done journal (an append in progress, or a crash inside one) is reported as a
    fact, not cut; its input counts as not analysed. An input named by two done lines is a
    problem: the master appends a done line only in a group commit, after which the input is
    never dispatched again, so a crash can lose a line (the input is then analysed again and
    gets its only line) but never leaves two."""
    if not (out / MARKER).is_file():
        raise CampaignError(f"{out} holds no symcc-mpi campaign")
    campaign = CampaignDir(out)
    problems: list[str] = []
    corpus = {}
    for path in sorted(campaign.corpus.iterdir()):
        digest = sha256_file(path)
        corpus[path.name] = digest
        if digest != path.name:
            problems.append(f"corpus/{path.name} holds bytes whose SHA-256 is {digest}")
    records, torn = campaign.inspect_done()
    done = [record["sha256"] for record in records]
    observations = Counter(done)
    twice = sorted(d for d, n in observations.items() if n > 1)
    if twice:
        problems.append(f"{len(twice)} inputs analysed more than once, e.g. {twice[0]}")
    unknown = sorted(set(observations) - set(corpus))
    if unknown:
        problems.append(f"{len(unknown)} analysed inputs are missing from corpus/")
    queue_hashes = {sha256_file(p) for p in campaign.queue.iterdir() if p.name.startswith("id:")}
    unqueued = sorted(set(corpus) - queue_hashes)
    if unqueued:
        problems.append(f"{len(unqueued)} corpus inputs have no queue/ entry")
    leftovers = campaign.leftover_staging()
    if leftovers:
        problems.append(f"{len(leftovers)} staging directories left in {campaign.staging}")
    deferred, damaged = _read_deferred(campaign.state / DEFERRED_JOURNAL_NAME)
    if damaged:
        problems.append(f"{damaged} damaged lines in state/{DEFERRED_JOURNAL_NAME}")
    pending = set(corpus) - set(observations)
    extra = _read_stats(out).get("extra", {})
    stop_reason = extra.get("stop_reason", "?")
    unaccounted = len(pending - deferred)
    if stop_reason == "frontier exhausted" and unaccounted:
        problems.append(f"campaign says its frontier is exhausted but {unaccounted} inputs "
                        "were neither analysed nor deferred")
    dispatch = extra.get("dispatch", {})
    held = sum(dispatch.get(table, 0) for table in ("preparing", "active", "committing"))
    if extra.get("phase") == "done" and held:
        problems.append(f"the master ended holding {held} dispatch transactions")
    facts = {
        "corpus inputs": len(corpus),
        "analysed (observations)": len(done),
        "analysed (unique)": len(observations),
        "observations / unique": round(len(done) / len(observations), 4) if done else 0,
        "pending": len(pending),
        "deferred": len(deferred),
        "crashes": sum(1 for p in campaign.crashes.iterdir() if p.name.startswith("id:")),
        "hangs": sum(1 for p in campaign.hangs.iterdir() if p.name.startswith("id:")),
        "stop reason": stop_reason,
        "done journal": f"torn last line {torn.line}, left in place" if torn else "intact",
    }
    return problems, facts


def _read_deferred(path: Path) -> tuple[set[str], int]:
    """The inputs set aside after protocol failures, and how many lines could not be read."""
    deferred: set[str] = set()

    def take(record: dict) -> None:
        if not isinstance(record.get("work"), str):
            raise ValueError("no work id")
        deferred.add(record["work"])

    return deferred, len(inspect(path, take))


def _read_stats(out: Path) -> dict:
    try:
        return json.loads((out / "stats.json").read_text())
    except (OSError, ValueError):
        return {}
