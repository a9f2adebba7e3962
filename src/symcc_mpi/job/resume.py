"""--resume, and a master taking over: the campaign's state read back from its directory
(the snapshot or the done journal, the commits to redo, the coverage to replay)."""

from __future__ import annotations

import logging
import os

from symcc_mpi.campaign import wal
from symcc_mpi.campaign.commit import Unusable, decode_manifest
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.wal import (
    Kind,
    committed_parts,
    kind_of,
    outstanding,
    replay_epochs,
    work_of,
)
from symcc_mpi.config import CampaignConfig, check_seeds
from symcc_mpi.scheduling.splitting import SPLIT_ANEW, parse_work_id
from symcc_mpi.wire.protocol import MalformedMessage

log = logging.getLogger(__name__)


def load_state(master, config: CampaignConfig, campaign: CampaignDir,
                covered_entries: int, *, taking_over: bool = False,
                names_entries: bool = True, saved=None, unqueued=(), probe=None) -> None:
    """Seeds in, then the frontier: every corpus input not yet in a done journal (every
    master's); the commits a dead master left half done are finished first (F443 §4 step 7).
    `names_entries`: this master names queue/ entries (not a master joining another).
    `saved`: the snapshot the last run left (snapshot.py), restored already with what its
    publish log names (`unqueued`: the inputs published after it without a queue/ entry):
    only the journal records after it are read, the directories not listed. `probe` makes
    the coverage probe that replays what the saved triage map does not cover."""
    if taking_over or config.resume:
        # A master that died (not its machine) may have published files its next group
        # commit would have made durable: their bytes are in the page cache only, and this
        # master's own fsyncs of their directories would make their names durable without
        # them (a power failure then leaves a corpus file with no bytes). To disk first.
        os.sync()
    seeds = []
    if config.seeds is not None and config.seeds.is_dir() and not taking_over \
            and names_entries:
        seeds = [campaign.add_seed(path.read_bytes(), path.name)  # by the run's first master
                 for path in check_seeds(config.seeds)]
    master.dispatch.seeds.update(seeds)
    campaign.sync_done()  # the new seeds are durable before any done line vouches for one
    # The lock is held: a torn last line is cut (and quarantined) here, and only here.
    everything = campaign.open_journal(writer=master.faults.done_writer(config.out),
                                       after=saved)
    past = replay_epochs(everything, epoch=campaign.epoch)
    campaign.epoch = master.dispatch.epoch = past.epoch
    if master.lower is not None:
        master.lower.schedule.epoch = past.epoch
    journal = past.current  # earlier epochs' work is settled: none was in flight at their end
    done = past.done | campaign.done_elsewhere()  # other masters', of this run or another
    if saved is None:
        _rebuild_frontier(master, campaign, past, done, journal, names_entries)
    else:
        _follow_snapshot(master, campaign, seeds, done, journal, names_entries, unqueued)
    if names_entries and campaign.adopt_findings():
        log.warning("named the crashes and hangs other masters found before the last run "
                    "ended")
    done |= _redo_commits(master, journal, done)
    if master.triage is not None:  # after the redone commits, which publish unprobed
        uncovered = master.frontier.queued_from(covered_entries) \
            if covered_entries < campaign.queue_entries else []
        if covered_entries:
            log.info("triage map saved over %d queue entries: replaying %d through "
                     "the AFL build", covered_entries, len(uncovered))
        _replay_coverage(master, probe, campaign, uncovered)
    if master.lower is not None and master.lower.pool is not None:
        frontier = master.frontier
        pooled = master.lower.pool.load(
            lambda digest: frontier.seen_before(digest) and not frontier.awaits_aside(digest))
        for digest in master.lower.pool.pending_digests():
            master.frontier.set_aside(digest)
        if pooled:
            log.info("%d inputs set aside earlier wait in the aside pool (tier 2)", pooled)
    # Work the last master dispatched and neither committed nor took back: in the frontier
    # again, and on record as in flight at its end (the journal's dispatch records, and
    # the snapshot's for those before it).
    before = [{"kind": Kind.DISPATCH.value, "digest": digest, "part": part}
              for digest, part in map(parse_work_id, saved.in_flight if saved else ())]
    left_out = outstanding(before + journal)
    master.in_flight_at_takeover = sorted(work for work in left_out
                                          if parse_work_id(work)[0] not in done)
    # Another master's done journal holds it: that master took its lease over (F320), and
    # the stale result was dropped before its take-back was on record.
    for work in sorted(set(left_out) - set(master.in_flight_at_takeover)):
        digest, part = parse_work_id(work)
        campaign.record_work(wal.Requeue(digest=digest, reason="another master analysed it",
                                         part=part))
    # An input split and not finished is split anew: each part it committed goes out again.
    split_again = {work for work in committed_parts(journal)
                   if parse_work_id(work)[0] not in done} - set(master.in_flight_at_takeover)
    for work in sorted(split_again):
        digest, part = parse_work_id(work)
        campaign.record_work(wal.Requeue(digest=digest, part=part, reason=SPLIT_ANEW))
    if not taking_over:  # a resumed run: the last run's master died, or was stopped so
        for work in master.in_flight_at_takeover:
            digest, part = parse_work_id(work)
            campaign.record_work(wal.Requeue(digest=digest, reason="the last run ended",
                                             part=part))
    # Nothing of this master's is in flight before it starts; a master that takes a dead
    # one's place beside other masters removes only what the dead one's workers staged.
    campaign.clear_staging({r["token"] for r in journal if kind_of(r) is Kind.DISPATCH}
                           if taking_over and master.federation is not None else None)
    log.info("campaign %s: %d inputs, %d already analysed, %d in the frontier%s",
             config.out, len(master.frontier.known), master.stats.resumed_done,
             len(master.frontier), " (from the last run's snapshot)" if saved else "")


def _rebuild_frontier(master, campaign: CampaignDir, past, done: set[str],
                      journal: list[dict], names_entries: bool) -> None:
    """The frontier from the directories and the journal, when no snapshot serves."""
    corpus = campaign.corpus_digests()
    for digest in sorted(corpus) if names_entries else ():  # queue ids in one order
        if campaign.inputs.queue_id(digest) is None:  # promoted, then killed before queueing
            campaign.add_to_queue(digest, parent="")
    # In queue order; a master joining a running campaign (one taking a dead one's place)
    # also meets inputs the first master has not queued yet: after the others.
    ordered = sorted(corpus, key=lambda digest: (
        (queue_id := campaign.inputs.queue_id(digest)) is None, queue_id or 0, digest))
    committing = {r["digest"] for r in journal
                  if kind_of(r) is Kind.COMMIT and r.get("part") is None} - done
    for digest in ordered:  # a commit left half done is finished below, not analysed again
        if digest in past.done_before and digest not in done and digest not in committing:
            master.frontier.add_rerun(digest)  # tier 3 of the epoch in progress
        else:
            master.frontier.add(digest, done=digest in done or digest in committing)
    for digest in (past.done | past.done_before) - corpus:  # tier 2's, analysed
        master.frontier.see(digest)
        if digest in done:
            master.frontier.mark_done(digest)
    master.stats.resumed_done = len(done & corpus)


def _follow_snapshot(master, campaign: CampaignDir, seeds: list[str], done: set[str],
                     journal: list[dict], names_entries: bool, unqueued) -> None:
    """The restored frontier brought up to the journal's end: the inputs done after the
    snapshot, and those whose commit is finished below, leave it; the inputs published
    after it and not queued (their master died in between) are queued."""
    frontier = master.frontier
    for digest in seeds:  # new to this run
        frontier.add(digest, done=digest in done)
    committing = {r["digest"] for r in journal
                  if kind_of(r) is Kind.COMMIT and r.get("part") is None}
    for digest in done | committing:
        if digest not in frontier.known:  # an input of the aside pool (tier 2)
            frontier.see(digest)
        frontier.mark_done(digest)
    for digest in unqueued if names_entries else ():
        if campaign.inputs.queue_id(digest) is None:
            campaign.add_to_queue(digest, parent="")
    frontier.rebuild_pending()
    master.stats.resumed_done = len(frontier.done)
    if journal:
        log.info("the last run's snapshot is followed by %d records: replayed", len(journal))


def _redo_commits(master, journal: list[dict], done: set[str]) -> set[str]:
    """Finish every commit whose manifest is in the journal without its done record: check
    the manifest's staged files again and commit them as the dead master would have. One
    that cannot be finished (its staging is gone or refused) leaves its input in the
    frontier, to be analysed again. Returns the inputs committed."""

    redone: set[str] = set()
    parts_done = {work_of(r) for r in journal if kind_of(r) is Kind.PART}
    pending = {work_of(r): r for r in journal if kind_of(r) is Kind.COMMIT
               and r["digest"] not in done and work_of(r) not in parts_done}
    for work, record in pending.items():
        digest, part = parse_work_id(work)
        try:
            result = decode_manifest(record)
            accepted = master.committer.check(result, digest)
        except (MalformedMessage, Unusable) as problem:
            log.warning("the commit of %s left by the last master cannot be finished (%s): "
                        "it is analysed again", work[:12], problem)
            if part is None:
                master.frontier.reopen(digest)
            continue
        # A part's children are published; its input, not done, is split anew.
        master.committer.commit(None, result, accepted, part=part,
                                completes_input=part is None)
        if part is None:
            redone.add(digest)
    if redone:
        # Durable before the other masters read this journal (job/federated.py): else one
        # of them analyses again what was just committed here.
        master.campaign.sync_done()
        master.stats.redone_commits += len(redone)
        log.info("finished %d commits the last master left half done", len(redone))
    return redone


def _replay_coverage(master, make_probe, campaign: CampaignDir, ordered: list[str]) -> None:
    if not ordered:
        return
    with make_probe() as probe:
        for digest in ordered:
            try:
                data = campaign.read_input(digest)
            except OSError as error:  # quarantined (corrupt) or gone: its dispatch says so
                log.warning("replaying the coverage of %s: %s", digest[:12], error)
                continue
            master.triage.merge(probe.probe_bytes(data))
    master.checkpoint.triage_dirty = True
