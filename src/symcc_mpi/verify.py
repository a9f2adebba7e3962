"""End-to-end oracles over a campaign directory (DESIGN §7)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .corpus import MARKER, CampaignDir, CampaignError, sha256_file


def verify_campaign(out: Path) -> tuple[list[str], dict]:
    """Return (problems, facts); no problem means every oracle holds."""
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
    done = [record["sha256"] for record in campaign.read_done()]
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
    pending = len(set(corpus) - set(observations))
    stop_reason = _read_stats(out).get("extra", {}).get("stop_reason", "?")
    if stop_reason == "frontier exhausted" and pending:
        problems.append(f"campaign says its frontier is exhausted but {pending} inputs "
                        "were never analysed")
    facts = {
        "corpus inputs": len(corpus),
        "analysed (observations)": len(done),
        "analysed (unique)": len(observations),
        "observations / unique": round(len(done) / len(observations), 4) if done else 0,
        "pending": pending,
        "crashes": sum(1 for p in campaign.crashes.iterdir() if p.name.startswith("id:")),
        "hangs": sum(1 for p in campaign.hangs.iterdir() if p.name.startswith("id:")),
        "stop reason": stop_reason,
    }
    return problems, facts


def _read_stats(out: Path) -> dict:
    try:
        return json.loads((out / "stats.json").read_text())
    except (OSError, ValueError):
        return {}
