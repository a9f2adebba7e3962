"""The master's commit path (commit.Committer): which children of a RESULT are read, verified,
triaged and promoted, and what the commit records. Real campaign directory, frontier,
coverage map and pruning ledger; no MPI traffic."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import msgspec
import pytest

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.campaign.commit import Committer, Refused, Unusable
from symcc_mpi.campaign.corpus import CampaignDir, CorruptInput
from symcc_mpi.campaign.layout import check_out_dir, sha256_bytes
from symcc_mpi.campaign.stats import MasterStats, WorkerStats
from symcc_mpi.coverage.edges import FileCoverage, Status
from symcc_mpi.coverage.pruning import Delta, PruningLedger, PruningMode
from symcc_mpi.coverage.pruning import encode as encode_delta
from symcc_mpi.coverage.triage import CoverageMap
from symcc_mpi.wire.protocol import INVALID_INPUT, Result, ResultField, StagedFile
from symcc_mpi.wire.staging import write_entries

TOKEN = "cd" * 16
RANK = 1
MAP_SIZE = 1 << 16


class Setup:
    def __init__(self, tmp_path, *, triage: bool):
        self.campaign = CampaignDir(tmp_path / "out")
        check_out_dir(self.campaign.out, resume=False)
        self.campaign.create({"test": True})
        self.campaign.lock()  # the master's: it alone appends to the done journal
        self.frontier = self.campaign.inputs
        self.stats = MasterStats(per_worker={RANK: WorkerStats()})
        self.triage = CoverageMap(MAP_SIZE) if triage else None
        self.pruning = PruningLedger(PruningMode.SHARED)
        self.checkpoint = Checkpointer(self.campaign, pruning=self.pruning, triage=self.triage)
        self.committer = Committer(self.campaign, self.frontier, self.stats,
                                   triage=self.triage, pruning=self.pruning,
                                   checkpoint=self.checkpoint)
        self.parent = self.campaign.add_seed(b"seed input", "seed")
        self.frontier.add(self.parent)
        self.frontier.set_depth(self.parent, 3)
        self.packed: dict[str, bytes] = {}  # what `result` packs for each staged digest

    def stage(self, data: bytes, pairs=None, status=Status.OK, *, write=True) -> StagedFile:
        """A staged child; with write=False the pack holds other bytes under its name, so
        that reading it fails (it must not be read)."""
        digest = sha256_bytes(data)
        self.packed[digest] = data if write else bytes(b ^ 0xFF for b in data)
        coverage = None if pairs is None else \
            FileCoverage.from_pairs(pairs, status, MAP_SIZE).pack()
        return StagedFile(digest, len(data), coverage, status.value)

    def result(self, staged=(), **fields) -> Result:
        """A RESULT of these staged children, their pack written as the worker would."""
        values = dict(token=TOKEN, digest=self.parent, outcome="ok", exit_status=0,
                      wall_time=0.5, solver_time=0.25, staged=list(staged),
                      generated=len(staged))
        values.update(fields)
        if staged:
            self.campaign.staging.mkdir(exist_ok=True)
            write_entries(Path(self.campaign.staged_pack(values["token"])),
                          [(s.digest, self.packed.get(s.digest, bytes(s.size))) for s in staged])
        return Result(**values)

    def check_and_commit(self, result: Result):
        accepted = self.committer.check(result, self.parent)
        self.committer.commit(RANK, result, accepted)
        return accepted

    def queue_names(self) -> list[str]:
        return sorted(os.listdir(self.campaign.queue))

    def crash_names(self) -> list[str]:
        return sorted(os.listdir(self.campaign.crashes))


@pytest.fixture
def plain(tmp_path):
    s = Setup(tmp_path, triage=False)
    yield s
    s.campaign.close()


@pytest.fixture
def triaged(tmp_path):
    s = Setup(tmp_path, triage=True)
    yield s
    s.campaign.close()


# -- check: results that cannot be committed ------------------------------------------------


def test_not_analysed_outcome_is_unusable_with_its_message(plain):
    result = plain.result(outcome=INVALID_INPUT, message="bytes differ from their hash")
    with pytest.raises(Unusable, match="bytes differ from their hash"):
        plain.committer.check(result, plain.parent)
    with pytest.raises(Unusable, match="worker-error"):
        plain.committer.check(plain.result(outcome="worker-error"), plain.parent)


def test_other_digest_than_sent_is_unusable(plain):
    with pytest.raises(Unusable, match="other bytes"):
        plain.committer.check(plain.result(digest="e" * 64), plain.parent)
    with pytest.raises(Unusable):
        plain.committer.check(plain.result(), None)  # nothing was sent to that rank


@pytest.mark.parametrize("payload", [
    b"\xc1 not msgpack",
    encode_delta(Delta(indices=b"\x00\x00\x00", bits=b"\x01")),  # 3 index bytes, 1 entry
    encode_delta(Delta(indices=(1 << 20).to_bytes(4, "little"), bits=b"\x01")),  # off map
    encode_delta(Delta(full=b"\x01" * 10)),  # a "whole map" of the wrong size
])
def test_malformed_pruning_delta_is_unusable(plain, payload):
    with pytest.raises(Unusable, match="pruning delta"):
        plain.committer.check(plain.result(pruning=payload), plain.parent)
    assert plain.pruning.statistics().merged == 0


@pytest.mark.parametrize("coverage", [
    b"\xc1 not msgpack",
    FileCoverage(Status.OK, edges=b"\x01\x00\x00", buckets=b"\x01").pack(),  # 3 index bytes
    FileCoverage(Status.OK, edges=b"\x01\x00\x00\x00", buckets=b"\x03").pack(),  # not a bit
    FileCoverage(Status.OK, map_size=-1).pack(),
])
def test_malformed_coverage_summary_is_unusable(triaged, coverage):
    child = StagedFile(sha256_bytes(b"child"), 5, coverage)
    with pytest.raises(Unusable, match="coverage summary"):
        triaged.committer.check(triaged.result([child]), triaged.parent)


def test_coverage_index_beyond_any_afl_map_is_unusable_at_check(triaged):
    # BUG: FileCoverage.validate() accepts any u32 index, so check() passes this summary
    # (adds_coverage: "an edge beyond everything seen") and commit() raises ValueError from
    # CoverageMap.merge_novelty -- after the first child was promoted and queued, and out
    # of the master's dispatch boundary (which re-raises): one bad summary stops the master.
    first = triaged.stage(b"first child", [(5, 1)])
    bad = triaged.stage(b"bad child", [(1 << 28, 1)])
    with pytest.raises(Unusable, match="coverage summary"):
        triaged.committer.check(triaged.result([first, bad]), triaged.parent)


def test_child_whose_bytes_do_not_match_its_name_is_rejected(plain):
    child = plain.stage(b"child")
    plain.packed[child.digest] = b"chilD"
    with pytest.raises(Refused, match="staged results rejected.*do not match") as refused:
        plain.committer.check(plain.result([child]), plain.parent)
    assert refused.value.field is ResultField.STAGED_BYTES
    assert plain.stats.staging_rejected == 1
    other = plain.stage(b"other child")
    result = plain.result([other])
    os.unlink(plain.campaign.staged_pack(TOKEN))
    with pytest.raises(Refused, match="staged results rejected: no staged pack") as refused:
        plain.committer.check(result, plain.parent)
    assert refused.value.field is ResultField.MISSING_FILE
    assert plain.stats.staging_rejected == 2


def test_a_pack_that_is_not_what_its_result_lists_is_rejected(plain):
    first, second = plain.stage(b"first"), plain.stage(b"second")
    plain.result([first])  # the pack holds the first alone
    result = Result(**{**msgspec.structs.asdict(plain.result()), "staged": [first, second],
                       "generated": 2})
    with pytest.raises(Refused, match="not in the staged pack") as refused:
        plain.committer.check(result, plain.parent)
    assert refused.value.field is ResultField.MISSING_FILE
    plain.result([first, second])  # both, listed the other way round: read by digest
    result = Result(**{**msgspec.structs.asdict(result), "staged": [second, first]})
    assert len(plain.committer.check(result, plain.parent).children) == 2
    shorter = Result(**{**msgspec.structs.asdict(result), "staged": [
        msgspec.structs.replace(second, size=second.size - 1)], "generated": 1})
    with pytest.raises(Refused, match="not in the staged pack") as refused:
        plain.committer.check(shorter, plain.parent)
    assert refused.value.field is ResultField.MISSING_FILE
    pack = plain.campaign.staged_pack(TOKEN)
    os.unlink(pack)
    os.mkfifo(pack)  # opening it for reading would wait for a writer for ever
    with pytest.raises(Refused, match="staged pack is a FIFO") as refused:
        plain.committer.check(result, plain.parent)
    assert refused.value.field is ResultField.NOT_REGULAR
    assert plain.stats.staging_rejected == 3


def test_child_with_new_coverage_is_verified(triaged):
    child = triaged.stage(b"child", [(7, 1)], write=False)
    with pytest.raises(Unusable, match="staged results rejected"):
        triaged.committer.check(triaged.result([child]), triaged.parent)
    assert triaged.stats.staging_rejected == 1


# -- check: what is not read ----------------------------------------------------------------


def test_known_or_seen_children_are_skipped_unread(plain):
    known = plain.stage(b"known child", write=False)
    seen = plain.stage(b"seen child", write=False)
    plain.frontier.add(known.digest)
    plain.frontier.see(seen.digest)
    also_parent = StagedFile(plain.parent, len(b"seed input"))  # the input regenerated
    result = plain.result([known, seen, also_parent])
    accepted = plain.committer.check(result, plain.parent)
    assert accepted.children == []
    plain.committer.commit(RANK, result, accepted)
    assert plain.stats.unique == 0 and plain.stats.interesting == 0
    assert len(plain.queue_names()) == 1  # the seed alone


def test_child_adding_no_coverage_is_not_read_nor_promoted(triaged):
    triaged.triage.merge(FileCoverage.from_pairs([(1, 1), (2, 4)], map_size=MAP_SIZE))
    dull = triaged.stage(b"dull child", [(1, 1), (2, 4)], write=False)
    empty = triaged.stage(b"empty child", [], write=False)  # no edge at all
    result = triaged.result([dull, empty])
    accepted = triaged.committer.check(result, triaged.parent)
    assert [c.may_keep for c in accepted.children] == [False, False]
    triaged.committer.commit(RANK, result, accepted)
    assert triaged.frontier.seen_before(dull.digest)
    assert triaged.frontier.seen_before(empty.digest)
    assert dull.digest not in triaged.frontier.known
    assert not (triaged.campaign.corpus / dull.digest).exists()
    assert triaged.stats.unique == 2 and triaged.stats.interesting == 0
    assert len(triaged.queue_names()) == 1
    assert not triaged.checkpoint.triage_dirty
    # Seen now: a later result regenerating it skips it before even decoding its coverage.
    assert triaged.committer.check(triaged.result([dull]), triaged.parent).children == []


# -- commit: promotion ----------------------------------------------------------------------


def test_child_with_new_coverage_is_promoted_queued_and_pending(triaged):
    child = triaged.stage(b"new child", [(9, 1), (10, 2)])
    triaged.check_and_commit(triaged.result([child]))
    digest = child.digest
    assert (triaged.campaign.corpus / digest).read_bytes() == b"new child"
    # The bytes the master verified are published, never the staged file itself (a worker's
    # file that could still change): corpus/ and queue/ are the file's only names.
    assert os.stat(triaged.campaign.corpus / digest).st_nlink == 2
    assert os.path.samefile(triaged.campaign.corpus / digest,
                            triaged.campaign.queue / triaged.queue_names()[-1])
    parent_id = triaged.frontier.queue_id(triaged.parent)
    child_id = triaged.frontier.queue_id(digest)
    name = f"id:{child_id:06d},src:{parent_id:06d},op:symcc"
    assert name in triaged.queue_names()
    assert (triaged.campaign.queue / name).read_bytes() == b"new child"
    assert triaged.frontier.depth(digest) == 4
    assert triaged.stats.max_depth == 4
    assert list(triaged.frontier.pending) == [triaged.parent, digest]
    assert triaged.stats.unique == 1 and triaged.stats.interesting == 1
    assert triaged.stats.last_find > 0
    assert triaged.checkpoint.triage_dirty
    assert triaged.triage.edges_covered == 2


def test_a_child_whose_corpus_file_was_found_damaged_is_published_again_when_yielded_again(
        triaged):
    # A power failure kept corpus/<child> and its queue/ entry (one inode) named, and lost
    # their bytes; the done record of its parent was lost with them.
    child = triaged.stage(b"new child", [(9, 1), (10, 2)])
    triaged.check_and_commit(triaged.result([child]))
    entry = triaged.campaign.queue / triaged.queue_names()[-1]
    os.truncate(triaged.campaign.corpus / child.digest, 0)
    with pytest.raises(CorruptInput):
        triaged.campaign.read_input(child.digest)
    resumed = Committer(triaged.campaign, triaged.frontier, triaged.stats,  # a map without
                        triage=CoverageMap(MAP_SIZE), pruning=triaged.pruning,  # its edges
                        checkpoint=triaged.checkpoint)
    # Its parent, analysed again, yields it again: known, yet read, kept and published.
    result = triaged.result([child])
    resumed.commit(RANK, result, resumed.check(result, triaged.parent))
    assert triaged.campaign.read_input(child.digest) == b"new child"
    assert os.path.samefile(triaged.campaign.corpus / child.digest, entry)
    assert resumed.repaired == [child.digest] == resumed.published
    assert triaged.stats.interesting == 1  # found once
    assert list(triaged.frontier.pending).count(child.digest) == 1
    # Once repaired it is known as any other: the next one is skipped unread.
    assert resumed.check(triaged.result([child]), triaged.parent).children == []


def test_depth_of_a_child_of_a_seed_without_depth_is_two(plain):
    other = plain.campaign.add_seed(b"other seed", "other")
    plain.parent = other
    child = plain.stage(b"grandchild")
    plain.check_and_commit(plain.result([child], digest=other))
    assert plain.frontier.depth(child.digest) == 2


def test_two_children_with_the_same_coverage_keep_the_first(triaged):
    first = triaged.stage(b"first", [(20, 1), (21, 1)])
    second = triaged.stage(b"second", [(20, 1), (21, 1)])
    accepted = triaged.check_and_commit(triaged.result([first, second]))
    assert [c.may_keep for c in accepted.children] == [True, True]  # both verified
    assert (triaged.campaign.corpus / first.digest).exists()
    assert not (triaged.campaign.corpus / second.digest).exists()
    assert first.digest in triaged.frontier.known
    assert second.digest not in triaged.frontier.known
    assert triaged.frontier.seen_before(second.digest)
    assert triaged.stats.unique == 2 and triaged.stats.interesting == 1
    assert len(triaged.queue_names()) == 2


def test_without_triage_every_new_child_is_verified_and_kept(plain):
    children = [plain.stage(b"a"), plain.stage(b"b", [(1, 1)]), plain.stage(b"c")]
    plain.frontier.see(children[2].digest)  # seen already: skipped
    accepted = plain.check_and_commit(plain.result(children))
    assert [c.staged for c in accepted.children] == children[:2]
    assert all(c.may_keep and c.coverage is None for c in accepted.children)
    for child in children[:2]:
        assert child.digest in plain.frontier.known
        assert (plain.campaign.corpus / child.digest).exists()
    assert plain.stats.interesting == 2
    assert len(plain.queue_names()) == 3
    assert not plain.checkpoint.triage_dirty


def test_a_child_listed_twice_is_never_queued_twice(plain):
    # An honest worker stages each digest once: a manifest listing one twice is refused
    # whole (issue 9), so the child is queued neither twice nor at all from this RESULT.
    child = plain.stage(b"twice")
    with pytest.raises(Refused) as refused:
        plain.check_and_commit(plain.result([child, child]))
    assert refused.value.field is ResultField.DUPLICATE
    assert len(plain.queue_names()) == 1  # the seed alone
    assert plain.stats.unique == 0 and plain.stats.interesting == 0


# -- commit: crashes ------------------------------------------------------------------------


def test_crashing_child_is_verified_and_saved_once(triaged):
    crash = triaged.stage(b"crashing child", [(3, 1)], Status.CRASH, write=False)
    with pytest.raises(Unusable, match="staged results rejected"):
        triaged.committer.check(triaged.result([crash]), triaged.parent)
    crash = triaged.stage(b"crashing child", [(3, 1)], Status.CRASH)
    triaged.check_and_commit(triaged.result([crash]))
    names = triaged.crash_names()
    parent_id = triaged.frontier.queue_id(triaged.parent)
    assert names == [f"id:000000,src:{parent_id:06d},op:symcc"]
    assert (triaged.campaign.crashes / names[0]).read_bytes() == b"crashing child"
    assert triaged.stats.crashes == 1 and triaged.stats.crashing_runs == 1
    assert triaged.stats.first_crash_seconds is not None
    assert triaged.stats.interesting == 0
    assert crash.digest not in triaged.frontier.known
    assert not (triaged.campaign.corpus / crash.digest).exists()
    # The same crash again (another token, not seen on this master): not saved twice.
    triaged.frontier = triaged.committer.frontier = type(triaged.frontier)()
    triaged.frontier.add(triaged.parent)
    triaged.packed[crash.digest] = b"crashing child"
    triaged.check_and_commit(triaged.result([crash], token="ef" * 16))
    assert len(triaged.crash_names()) == 1
    assert triaged.stats.crashes == 1 and triaged.stats.crashing_runs == 2


def test_crashing_parent_is_saved_with_its_signal(plain):
    plain.check_and_commit(plain.result(outcome="crash", exit_status=-11))
    names = plain.crash_names()
    assert len(names) == 1 and ",sig:11" in names[0]
    assert (plain.campaign.crashes / names[0]).read_bytes() == b"seed input"
    assert plain.stats.crashes == 1 and plain.stats.crashing_runs == 1
    plain.campaign.sync_done()
    assert plain.campaign.read_done()[-1]["outcome"] == "crash"


# -- commit: records and figures ------------------------------------------------------------


def test_commit_records_done_figures_and_pruning(triaged):
    delta = Delta(indices=(5).to_bytes(4, "little") + (6).to_bytes(4, "little"),
                  bits=b"\x01\x02")
    child = triaged.stage(b"child", [(40, 1)])
    result = triaged.result([child], pruning=encode_delta(delta), generated=7,
                            solver_queries=11, queries_skipped=3)
    triaged.check_and_commit(result)
    triaged.campaign.sync_done()
    records = triaged.campaign.read_done()
    assert [(r["digest"], r["token"], r["outcome"]) for r in records] == \
        [(triaged.parent, TOKEN, "ok")]
    stats = triaged.stats
    assert (stats.executions, stats.generated, stats.solver_queries) == (1, 7, 11)
    assert (stats.queries_skipped, stats.runs_without_counts) == (3, 0)
    assert stats.executor_time == 0.5 and stats.solver_time == 0.25
    assert stats.per_worker[RANK].executions == 1
    assert stats.per_worker[RANK].executor_time == 0.5
    ledger = triaged.pruning.statistics()
    assert ledger.merged == 1 and ledger.new_entries == 2
    assert triaged.pruning.dirty
    assert triaged.checkpoint.triage_dirty

    # A second run: sums, and one whose skipped queries are unknown.
    second = triaged.result(token="ab" * 16, generated=2, solver_queries=4,
                            queries_skipped=None)
    triaged.check_and_commit(second)
    assert (stats.executions, stats.generated, stats.solver_queries) == (2, 9, 15)
    assert (stats.queries_skipped, stats.runs_without_counts) == (3, 1)
    assert triaged.pruning.statistics().merged == 1  # an empty delta merges nothing
    triaged.campaign.sync_done()
    assert len(triaged.campaign.read_done()) == 2


def test_no_coverage_growth_leaves_the_triage_map_clean(triaged):
    triaged.check_and_commit(triaged.result())
    assert not triaged.checkpoint.triage_dirty
    assert triaged.stats.executions == 1


def test_an_outcome_outside_the_closed_set_is_refused(plain):
    with pytest.raises(Refused) as refused:
        plain.check_and_commit(plain.result(outcome="something odd", message="boom"))
    assert refused.value.field is ResultField.OUTCOME
    assert plain.stats.executions == 0


def test_executor_error_is_counted_and_recorded(plain):
    plain.check_and_commit(plain.result(outcome="error", message="boom"))
    assert plain.stats.executor_errors == 1
    plain.campaign.sync_done()
    assert plain.campaign.read_done()[-1]["outcome"] == "error"


# -- commit: staged files that are not what was verified (issue 9) ---------------------------

OUTSIDE = b"bytes of a file outside the campaign: never published\n"


def public_bytes(s: Setup) -> list[bytes]:
    """Every file in corpus/, queue/, crashes/ and hangs/."""
    return [path.read_bytes() for directory in (s.campaign.corpus, s.campaign.queue,
                                                s.campaign.crashes, s.campaign.hangs)
            for path in directory.iterdir() if path.is_file()]


def assert_public_names_hold(s: Setup) -> None:
    for path in s.campaign.corpus.iterdir():
        assert sha256_bytes(path.read_bytes()) == path.name


@pytest.mark.parametrize("swap", ["rewrite", "symlink", "symlink-to-etc-passwd", "fifo"])
@pytest.mark.parametrize("kind", [Status.OK, Status.CRASH])
def test_a_staged_pack_changed_after_verification_never_reaches_the_corpus(triaged, tmp_path,
                                                                           swap, kind):
    """The hook between check (the pack read and verified) and commit (promote): the pack is
    rewritten or replaced. What is published is the verified bytes, under their name."""
    outside = tmp_path / "outside"
    outside.write_bytes(OUTSIDE)
    child = triaged.stage(b"verified child", [(11, 1)], kind)
    result = triaged.result([child])
    accepted = triaged.committer.check(result, triaged.parent)
    staged = Path(triaged.campaign.staged_pack(TOKEN))
    staged.unlink()
    if swap == "rewrite":
        write_entries(staged, [(child.digest, OUTSIDE)])
    elif swap == "symlink":
        staged.symlink_to(outside)
    elif swap == "symlink-to-etc-passwd":
        staged.symlink_to("/etc/passwd")
    else:
        os.mkfifo(staged)
    triaged.committer.commit(RANK, result, accepted)
    published = public_bytes(triaged)
    assert b"verified child" in published
    assert OUTSIDE not in published
    assert open("/etc/passwd", "rb").read() not in published
    assert_public_names_hold(triaged)
    for directory in (triaged.campaign.corpus, triaged.campaign.queue,
                      triaged.campaign.crashes):
        assert not any(p.is_symlink() for p in directory.iterdir())


@pytest.mark.parametrize("make", ["symlink", "symlink-to-etc-passwd", "fifo", "directory"])
def test_a_staged_pack_that_is_not_a_regular_file_is_rejected_unread(plain, tmp_path, make):
    """A pack that is a link to a real pack (or a FIFO, which must not block the master, or
    a directory): the result is refused, nothing is published."""
    real = tmp_path / "real-pack"
    write_entries(real, [(sha256_bytes(OUTSIDE), OUTSIDE)])
    child = StagedFile(sha256_bytes(OUTSIDE), len(OUTSIDE))
    plain.campaign.staging.mkdir(exist_ok=True)
    staged = Path(plain.campaign.staged_pack(TOKEN))
    if make == "symlink":
        staged.symlink_to(real)
    elif make == "symlink-to-etc-passwd":
        staged.symlink_to("/etc/passwd")
    elif make == "fifo":
        os.mkfifo(staged)
    else:
        staged.mkdir()
    result = Result(token=TOKEN, digest=plain.parent, outcome="ok", exit_status=0,
                    wall_time=0.5, solver_time=0.25, staged=[child], generated=1)
    with pytest.raises(Refused, match="staged results rejected.*not a regular file") as refused:
        plain.committer.check(result, plain.parent)
    assert refused.value.field is ResultField.NOT_REGULAR
    assert plain.stats.staging_rejected == 1
    assert OUTSIDE not in public_bytes(plain)


def test_a_staging_directory_that_is_a_symlink_is_rejected(plain, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_entries(elsewhere / TOKEN, [(sha256_bytes(OUTSIDE), OUTSIDE)])
    plain.campaign.staging.rmdir()
    plain.campaign.staging.symlink_to(elsewhere)
    child = StagedFile(sha256_bytes(OUTSIDE), len(OUTSIDE))
    result = Result(token=TOKEN, digest=plain.parent, outcome="ok", exit_status=0,
                    wall_time=0.5, solver_time=0.25, staged=[child], generated=1)
    with pytest.raises(Unusable, match="staged results rejected"):
        plain.committer.check(result, plain.parent)
    assert OUTSIDE not in public_bytes(plain)


# -- commit: a promotion that fails (issue 9) ------------------------------------------------


class FailingOnce:
    """Wraps one CampaignDir method: its `call`-th call raises OSError(errno)."""

    def __init__(self, method, call: int, error: int):
        self.method, self.call, self.error, self.calls = method, call, error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.call:
            raise OSError(self.error, os.strerror(self.error))
        return self.method(*args, **kwargs)


@pytest.mark.parametrize("where", ["promote", "add_to_queue", "save_finding"])
def test_a_failed_promotion_leaves_the_child_unseen_and_a_retry_promotes_it(triaged, where):
    kept = triaged.stage(b"kept first", [(20, 1)])
    failing = triaged.stage(b"fails to publish", [(21, 1)],
                            Status.CRASH if where == "save_finding" else Status.OK)
    result = triaged.result([kept, failing])
    accepted = triaged.committer.check(result, triaged.parent)
    # The first child publishes; the second's publication raises.
    call = 1 if where == "save_finding" else 2
    setattr(triaged.campaign, where,
            FailingOnce(getattr(triaged.campaign, where), call, errno.ENOSPC))
    with pytest.raises(OSError) as raised:
        triaged.committer.commit(RANK, result, accepted)
    assert raised.value.errno == errno.ENOSPC  # visible to the master's failure handler
    # What was promoted before the failure stays valid; the failing child is unseen.
    assert (triaged.campaign.corpus / kept.digest).read_bytes() == b"kept first"
    assert kept.digest in triaged.frontier.known
    assert not triaged.frontier.seen_before(failing.digest)
    assert triaged.parent not in triaged.frontier.done
    assert_public_names_hold(triaged)
    queue_before = triaged.queue_names()
    # The retried run of the same input (fresh staging) publishes the failed child.
    again = triaged.result([kept, failing], token="ef" * 16)
    triaged.committer.commit(RANK, again, triaged.committer.check(again, triaged.parent))
    assert triaged.frontier.seen_before(failing.digest)
    if where == "save_finding":
        assert [n.startswith("id:000000") for n in triaged.crash_names()] == [True]
        assert (triaged.campaign.crashes / triaged.crash_names()[0]).read_bytes() == \
            b"fails to publish"
    else:
        assert (triaged.campaign.corpus / failing.digest).read_bytes() == b"fails to publish"
        assert failing.digest in triaged.frontier.known
        names = triaged.queue_names()
        assert len(names) == len(queue_before) + 1
        # AFL queue ids stay dense: the failed link took no id.
        assert [int(n[3:9]) for n in names] == list(range(len(names)))


def test_refusals_at_check_name_their_field(plain):
    def field_of(res):
        with pytest.raises(Refused) as refused:
            plain.committer.check(res, plain.parent)
        return refused.value.field

    assert field_of(plain.result(digest="e" * 64)) is ResultField.DIGEST
    assert field_of(plain.result(pruning=b"\xc1 not msgpack")) is ResultField.PRUNING
    child = plain.stage(b"child", write=False)
    assert field_of(plain.result([child])) is ResultField.STAGED_BYTES
    absent = plain.result([plain.stage(b"absent")])
    os.unlink(plain.campaign.staged_pack(TOKEN))
    assert field_of(absent) is ResultField.MISSING_FILE
    fifo = plain.result([plain.stage(b"fifo")])
    os.unlink(plain.campaign.staged_pack(TOKEN))
    os.mkfifo(plain.campaign.staged_pack(TOKEN))  # never read
    assert field_of(fifo) is ResultField.NOT_REGULAR
    with pytest.raises(Unusable) as not_analysed:  # honest: not a refusal
        plain.committer.check(plain.result(outcome=INVALID_INPUT), plain.parent)
    assert not isinstance(not_analysed.value, Refused)


def test_executor_failures_are_grouped_by_reason_and_what_their_runs_wrote_is_kept(plain,
                                                                                     caplog):
    z3 = "SIGABRT in the symcc run, not in the AFL build: z3::exception"
    reasons = [z3, z3, "SIGSEGV in the symcc run, not in the AFL build", z3, ""]
    parents = []
    for index, reason in enumerate(reasons):
        plain.parent = plain.campaign.add_seed(f"seed {index}".encode(), f"seed-{index}")
        plain.frontier.add(plain.parent)
        parents.append(plain.parent)
        child = plain.stage(f"written before it died {index}".encode())
        with caplog.at_level("WARNING", logger="symcc_mpi.campaign.commit"):
            plain.check_and_commit(plain.result([child], token=f"{index:02x}" * 16,
                                                outcome="error", exit_status=-6,
                                                message=reason))
    stats = plain.stats
    assert stats.executor_errors == 5 and stats.crashes == stats.crashing_runs == 0
    assert stats.executor_failures == {
        z3: {"count": 3, "example": parents[0]},
        "SIGSEGV in the symcc run, not in the AFL build": {"count": 1, "example": parents[2]},
        "no reason given": {"count": 1, "example": parents[4]}}
    assert stats.interesting == 5  # every child the failed runs wrote is kept
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("all of the first 5 runs failed in the executor" in w for w in warnings) == 1
    assert sum("the executor failed on" in w for w in warnings) == 3  # one per reason


def test_a_confirmed_crash_is_no_executor_failure(plain):
    plain.check_and_commit(plain.result(outcome="crash", exit_status=-11, message="boom"))
    assert (plain.stats.crashes, plain.stats.executor_errors) == (1, 0)
    assert plain.stats.executor_failures == {}
