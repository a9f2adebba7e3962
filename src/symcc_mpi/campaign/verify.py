"""End-to-end oracles over a campaign directory (DESIGN §7)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import (
    LEASE_DIRECTORY_PREFIX,
    MARKER,
    CampaignError,
    done_journals,
    layout_of,
    sha256_file,
)
from symcc_mpi.campaign.wal import Kind, is_done, kind_of, outstanding, work_of
from symcc_mpi.durable.atomic import TEMPORARY_PREFIX
from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME
from symcc_mpi.durable.journal import inspect
from symcc_mpi.durable.storage import STORAGE_EXIT
from symcc_mpi.scheduling.splitting import SPLIT_ANEW
from symcc_mpi.ulfm.generations import (
    GENERATIONS_JOURNAL,
    GenerationLog,
    GenerationLogError,
    RecordKind,
)


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
    layout_of(out)
    campaign = CampaignDir(out)
    problems: list[str] = []
    corpus = {}
    for path in sorted(campaign.corpus.iterdir()):
        if path.name.startswith(TEMPORARY_PREFIX):
            continue  # an atomic write in progress, or one a crash interrupted
        try:
            digest = sha256_file(path)
        except FileNotFoundError:
            continue  # quarantined by the live master since the listing
        corpus[path.name] = digest
        if digest != path.name:
            problems.append(f"corpus/{path.name} holds bytes whose SHA-256 is {digest}")
    # One done journal per master that ever ran (--masters): together, the analysed set.
    journals = {path: campaign.inspect_journal(path) for path in done_journals(out)}
    journal, torn = journals.pop(campaign.done_journal, ([], None))
    records = [r for r in journal if is_done(r)]
    per_master = [len(records)]
    for other, _ in journals.values():
        per_master.append(sum(1 for r in other if is_done(r)))
        records += [r for r in other if is_done(r)]
    torn_elsewhere = [f"{path.parent.name}: line {damage.line}"
                      for path, (_, damage) in journals.items() if damage is not None]
    # Once per epoch (tiers/): each epoch analyses the corpus again, under a fresh map.
    per_epoch = Counter((r["digest"], r.get("epoch", 0)) for r in records)
    twice = sorted(d for (d, _), n in per_epoch.items() if n > 1)
    if twice:
        problems.append(f"{len(twice)} inputs analysed more than once in an epoch, "
                        f"e.g. {twice[0]}")
    observations = Counter(r["digest"] for r in records)
    # The aside pool's inputs (tier 2) are not kept: their bytes were checked by the worker
    # that ran them, their pack removed after.
    unknown = sorted({r["digest"] for r in records if r.get("tier") != 2} - set(corpus))
    if unknown:
        problems.append(f"{len(unknown)} analysed inputs are missing from corpus/")
    done = [r["digest"] for r in records]
    queue_digests = {sha256_file(p) for p in campaign.queue.iterdir() if p.name.startswith("id:")}
    unqueued = sorted(set(corpus) - queue_digests)
    if unqueued:
        problems.append(f"{len(unqueued)} corpus inputs have no queue/ entry")
    leftovers = campaign.leftover_staging()
    if leftovers:
        problems.append(f"{len(leftovers)} staging directories left in {campaign.staging}")
    deferred: set[str] = set()
    for path in [campaign.state / DEFERRED_JOURNAL_NAME,
                 *(journal.parent / DEFERRED_JOURNAL_NAME for journal in journals)]:
        set_aside, damaged = _read_deferred(path)
        deferred |= set_aside
        if damaged:
            problems.append(f"{damaged} damaged lines in {path.relative_to(out)}")
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
    lease_tables = sorted(p.name for p in out.glob(f"{LEASE_DIRECTORY_PREFIX}*"))
    if extra.get("phase") == "done" and lease_tables:
        problems.append(f"the lease table of an ended job is left in OUT: {lease_tables[0]}")
    work_problems, work_facts = _check_work(journal, set(corpus), extra)
    problems += work_problems
    for path, (other, _) in journals.items():  # each master's work is its own journal's
        problems += [f"{path.parent.name}: {problem}"
                     for problem in _check_work(other, set(corpus), extra)[0]]
    generation_problems, generation_facts = _check_generations(out, journal)
    problems += generation_problems
    facts = {
        "corpus inputs": len(corpus),
        "analysed (observations)": len(done),
        "analysed (unique)": len(observations),
        # per epoch: each one analyses the corpus again
        "observations / unique": round(len(done) / len(per_epoch), 4) if done else 0,
        "epochs": 1 + max((epoch for _, epoch in per_epoch), default=0),
        "analysed from the aside pool": sum(1 for r in records if r.get("tier") == 2),
        "pending": len(pending),
        "deferred": len(deferred),
        "crashes": sum(1 for p in campaign.crashes.iterdir() if p.name.startswith("id:")),
        "hangs": sum(1 for p in campaign.hangs.iterdir() if p.name.startswith("id:")),
        "stop reason": stop_reason,
        "done journal": f"torn last line {torn.line}, left in place" if torn else "intact",
        **({"analysed per master": " + ".join(map(str, per_master)),
            "other masters' journals": ", ".join(torn_elsewhere) or "intact"}
           if journals else {}),
        **work_facts,
        **generation_facts,
    }
    return problems, facts


def _check_work(journal: list[dict], corpus: set[str], extra: dict) -> tuple[list[str], dict]:
    """The work records of a fault-tolerant campaign (wal.py): every dispatch of an input
    after its first follows a declared take-back of the one before (a recovery, a protocol
    recovery, a shutdown); no child a done record published is missing from corpus/; at a
    clean end (not a stop for a filesystem that refused writes) nothing is still out."""
    problems: list[str] = []
    dispatches: Counter[str] = Counter()
    declared: Counter[str] = Counter()
    in_flight_at_failures = 0
    split_anew = 0
    missing_children: set[str] = set()
    for record in journal:
        kind = kind_of(record)
        epoch = record.get("epoch", 0)  # an epoch dispatches its corpus anew (tiers/)
        if kind is Kind.DISPATCH:
            dispatches[epoch, work_of(record)] += 1
        elif kind is Kind.REQUEUE:
            declared[epoch, work_of(record)] += 1
            split_anew += record.get("reason") == SPLIT_ANEW
        elif kind is Kind.RECOVERED:
            in_flight_at_failures += len(record["requeued"])
            declared.update((epoch, work) for work in record["requeued"])
        elif kind in (Kind.DONE, Kind.PART):
            missing_children.update(set(record.get("published", ())) - corpus)
    if not dispatches:
        return problems, {}
    out = outstanding(journal)
    unexplained = sorted(work for key, n in dispatches.items() if n > 1 + declared[key]
                         for work in (key[1],))
    if unexplained:
        problems.append(f"{len(unexplained)} inputs were dispatched again with no recovery of "
                        f"their earlier dispatch on record, e.g. {unexplained[0]}")
    if missing_children:
        problems.append(f"{len(missing_children)} children published by committed results are "
                        f"missing from corpus/, e.g. {min(missing_children)}")
    # A campaign OUT's filesystem stopped (storage.py) could not write down what became of
    # the work in flight: --resume redoes it (F443), and that run's end is a clean one.
    clean_end = extra.get("phase") == "done" and extra.get("exit_status") != STORAGE_EXIT
    if clean_end and out:
        problems.append(f"{len(out)} dispatches were neither committed nor taken back at the "
                        f"end, e.g. {min(out)}")
    again = sum(n - 1 for n in dispatches.values() if n > 1)
    return problems, {
        "dispatches": sum(dispatches.values()),
        "dispatched again (declared)": again,
        "in flight at failures": in_flight_at_failures,
        "parts split anew": split_anew,
        "out at the end": len(out),
    }


def _check_generations(out: Path, journal: list[dict]) -> tuple[list[str], dict]:
    """One receipt in the generation log per recovery the journal records, and the log
    itself whole (durable/generations.py)."""
    log = GenerationLog(out / "state" / GENERATIONS_JOURNAL)
    try:
        records = log.records()
    except GenerationLogError as error:
        return [str(error)], {}
    if not records:
        return [], {}
    receipts = {r.generation for r in records if r.kind is RecordKind.COMMIT}
    recovered = Counter(r["generation"] for r in journal if kind_of(r) is Kind.RECOVERED)
    problems = [f"generation {g} is recorded as recovered {n} times" for g, n in
                sorted(recovered.items()) if n > 1]
    unreceipted = sorted(set(recovered) - receipts)
    if unreceipted:
        problems.append(f"recoveries to generations {unreceipted} have no receipt in "
                        f"{log.path}")
    runs = sum(record.kind is RecordKind.START for record in records)
    return problems, {
        "generations": f"{records[-1].generation + 1} over {runs} runs",
        "recoveries (receipts)": len(receipts),
    }


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
