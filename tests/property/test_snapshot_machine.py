"""A lone master's snapshots and publish log (snapshot.py, published.py) against the slow
path: whatever the master did since its last snapshot and wherever it died (between a
publication's line and its file included), a resume from the snapshot knows exactly what
one that lists corpus/, queue/ and crashes/ and reads the whole journal knows."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from symcc_mpi.campaign import snapshot, wal
from symcc_mpi.campaign.afl_names import afl_queue_name
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import check_out_dir

TOKEN = "cd" * 16


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SnapshotMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="snapshot-machine-"))
        self.out = self.root / "out"
        check_out_dir(self.out, resume=False)
        self.campaign = CampaignDir(self.out)
        self.campaign.create({"test": True})
        self.campaign.lock()
        self.campaign.open_journal()
        self.made = 0
        self.durable_done: set[str] = set()  # done records synced (the model)
        self.pending_done: set[str] = set()  # recorded, lost if the master dies now
        self.snapshot_taken = False  # since the last resume, which took the one before
        seed = self.campaign.add_seed(b"seed", "seed")
        self.campaign.inputs.add(seed)
        self.snapshot()  # as a master's first round does

    def teardown(self):
        self.campaign.journal.close()
        self.campaign.publish_log.close()
        self.campaign._lock.release()
        shutil.rmtree(self.root)

    def _new_bytes(self) -> bytes:
        self.made += 1
        return b"generated %d" % self.made

    def _corpus(self) -> list[str]:
        return sorted(self.campaign.inputs.known)

    # -- what a master does ------------------------------------------------------------

    @rule(data=st.data())
    def keep_a_child(self, data):
        parent = data.draw(st.sampled_from(self._corpus()))
        child = self._new_bytes()
        digest = sha(child)
        self.campaign.promote(digest, child)
        self.campaign.add_to_queue(digest, parent)
        self.campaign.inputs.add(digest)

    @rule(data=st.data())
    def save_a_crash(self, data):
        parent = data.draw(st.sampled_from(self._corpus()))
        crash = self._new_bytes()
        self.campaign.save_finding("crashes", sha(crash), parent, 11, data=crash)

    @rule()
    def fail_to_queue_an_entry(self):
        """A link refused (OUT full, say) after its line: the master goes on, the id is
        announced again by the next entry."""
        child = self._new_bytes()
        self.campaign.publish_log.intend("queue", sha(child), afl_queue_name(
            self.campaign.queue_entries, (), op="refused"))

    @precondition(lambda self: set(self.campaign.inputs.known) - self.campaign.inputs.done)
    @rule(data=st.data())
    def analyse(self, data):
        waiting = sorted(set(self.campaign.inputs.known) - set(self.campaign.inputs.done))
        digest = data.draw(st.sampled_from(waiting))
        self.campaign.record_done(digest, TOKEN, "ok")
        self.campaign.inputs.mark_done(digest)
        self.pending_done.add(digest)

    @rule()
    def group_commit(self):
        self.campaign.sync_done()
        self.durable_done |= self.pending_done
        self.pending_done.clear()

    @rule()
    def snapshot(self):
        self.group_commit()  # as checkpoint.py takes one: right after a group commit
        self.campaign.save_snapshot(in_flight=[])
        self.snapshot_taken = True

    # -- how it ends ---------------------------------------------------------------------

    @rule()
    def die(self):
        self._resume()

    @rule()
    def die_after_a_promotion(self):
        child = self._new_bytes()
        self.campaign.promote(sha(child), child)  # not queued: killed right here
        self._resume()

    @rule()
    def die_after_announcing_an_entry(self):
        child = self._new_bytes()
        self.campaign.publish_log.intend("queue", sha(child), afl_queue_name(
            self.campaign.queue_entries, ()))  # its link never made
        self._resume()

    @rule()
    def close_cleanly(self):
        self.group_commit()
        self.campaign.snapshot_on_close = True
        self.campaign.close()
        self.snapshot_taken = True
        self._resume(died=False)

    def _resume(self, *, died: bool = True) -> None:
        if died:
            self.campaign.journal._log.close()
            self.campaign.publish_log.close()
            self.campaign._lock.release()
            self.pending_done.clear()
        listed = self._the_slow_way()
        campaign = CampaignDir(self.out)
        campaign.lock()
        saved = snapshot.take(campaign)
        assert (saved is not None) == self.snapshot_taken  # nothing here makes one unusable
        self.snapshot_taken = False
        if saved is None:
            campaign.read_queues()
            for digest in campaign.corpus_digests():
                campaign.inputs.add(digest)
            unqueued = sorted(d for d in campaign.inputs.known
                              if campaign.inputs.queue_id(d) is None)
            records = campaign.open_journal()
        else:
            event("resumed from a snapshot")
            unqueued = campaign.restore(saved)
            records = campaign.open_journal(after=saved)
        for record in records:
            if wal.is_done(record):
                campaign.inputs.mark_done(record["digest"])
        corpus = listed.corpus_digests()
        assert set(campaign.inputs.known) == corpus
        assert sorted(unqueued) == sorted(d for d in corpus if listed.inputs.queue_id(d) is None)
        assert {d: campaign.inputs.queue_id(d) for d in corpus} \
            == {d: listed.inputs.queue_id(d) for d in corpus}
        assert campaign.next_ids == listed.next_ids
        assert campaign.crash_digests == listed.crash_digests
        assert set(campaign.inputs.done) == self.durable_done
        for digest in unqueued:
            campaign.add_to_queue(digest, parent="")
        self.campaign = campaign

    def _the_slow_way(self) -> CampaignDir:
        listed = CampaignDir(self.out)
        listed.read_queues()
        return listed

    @invariant()
    def queue_ids_are_dense(self):
        ids = sorted(self.campaign.inputs.queue_id(d) for d in self.campaign.inputs.known
                     if self.campaign.inputs.queue_id(d) is not None)
        assert ids == list(range(len(ids)))


TestSnapshotMachine = SnapshotMachine.TestCase
TestSnapshotMachine.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
