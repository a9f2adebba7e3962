"""The master's RESULT handling against anything a worker can send (DESIGN §2, issue 9).

Hypothesis drives the real `Master._handle` (no mpiexec: a fake channel records the WORK the
master sends) with RESULTs built from arbitrary field values around real staged files, and
with arbitrary bytes under the RESULT tag, decoded as `transport.Channel.poll` decodes them.
After each message and the round's join, as `Master.run` performs it: nothing raised, every
corpus file is named by the SHA-256 of its bytes, nothing a refused RESULT named reached the
corpus, and the input of a refused RESULT is pending again or deferred, never done.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pytest
from fakes import LoopbackChannel
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import check_out_dir, sha256_bytes
from symcc_mpi.config import CampaignConfig
from symcc_mpi.coverage.edges import FileCoverage, Status
from symcc_mpi.coverage.triage import CoverageMap
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.roles.master import Master
from symcc_mpi.wire.protocol import MalformedMessage, Tag, decode
from symcc_mpi.wire.staging import write_entries
from symcc_mpi.wire.transport import Incoming

WORKERS = (1, 2)


def incoming(rank: int, payload: bytes) -> Incoming:
    try:
        return Incoming(rank, Tag.RESULT, decode(Tag.RESULT, payload))
    except MalformedMessage as error:
        return Incoming(rank, Tag.RESULT, None, str(error), error.field)


# One staged entry: how it relates to what its pack holds (Rig.build).
ENTRY_KINDS = ("honest", "honest", "wrong-name", "upper-name", "missing", "fifo", "link",
               "directory", "wrong-size", "negative-size")
COVERAGES = st.one_of(
    st.none(), st.binary(max_size=24),
    st.builds(lambda pairs, status, size: FileCoverage.from_pairs(pairs, status, size).pack(),
              st.lists(st.tuples(st.integers(0, 1 << 17), st.sampled_from([1, 2, 4, 128])),
                       max_size=4),
              st.sampled_from(list(Status)), st.sampled_from([0, 1 << 16, 1 << 20])))
ENTRIES = st.lists(st.tuples(st.sampled_from(ENTRY_KINDS), st.binary(min_size=1, max_size=12),
                             COVERAGES, st.sampled_from(["ok", "crash", "hang", "pwned"]),
                             st.booleans()),  # listed twice
                   max_size=4)
FIELDS = st.fixed_dictionaries({}, optional={
    "outcome": st.sampled_from(["ok", "crash", "timeout", "oom", "error", "invalid-input",
                                "worker-error", "pwned", ""]),
    "digest": st.sampled_from(["sent", "other", "junk"]),
    "token": st.sampled_from(["other", "junk"]),
    "exit_status": st.one_of(st.none(), st.integers(-(1 << 40), 1 << 40)),
    "wall_time": st.floats(allow_nan=True, allow_infinity=True),
    "solver_time": st.floats(allow_nan=True, allow_infinity=True),
    "generated": st.integers(-2, 1 << 21),
    "pruning": st.binary(max_size=16),
    "solver_queries": st.integers(-(1 << 63), 1 << 63),
    "queries_skipped": st.one_of(st.none(), st.integers(-5, 5)),
})
MESSAGES = st.lists(st.one_of(st.tuples(st.just("struct"), st.sampled_from(WORKERS), ENTRIES,
                                        FIELDS),
                              st.tuples(st.just("bytes"), st.sampled_from(WORKERS),
                                        st.binary(max_size=64), st.none())),
                    min_size=1, max_size=8)


class Rig:
    def __init__(self, out: Path, triage: bool):
        self.campaign = CampaignDir(out)
        check_out_dir(out, resume=False)
        self.campaign.create({"test": True})
        self.campaign.lock()  # the master's: it alone appends to the done journal
        config = CampaignConfig(target=("t", "@@"), seeds=out, out=out, workers=2)
        self.channel = LoopbackChannel(len(WORKERS))
        self.master = Master(self.channel, config, self.campaign,
                             triage=CoverageMap() if triage else None,
                             watchdog=WatchdogConfig(0, 1))
        for i in range(6):
            self.campaign.inputs.add(self.campaign.add_seed(b"seed %d" % i, f"s{i}"))
        self.planted = 0

    def close(self):
        self.master.close()

    def round(self):
        """Round steps 2-4 of `Master.run`: the join (discarding recovered staging), then
        dispatch to idle ranks."""
        for recovery in self.master.dispatch.join().recoveries:
            self.master.campaign.discard_staging(recovery.token)
        self.master.dispatch.dispatch(self.master.sender.send)

    def active(self, rank):
        works = [m for dest, tag, m in self.channel.sent if dest == rank and tag == Tag.WORK]
        token_input = works[-1] if works else None
        if token_input is None or self.master.dispatch.work_of(rank) != token_input.digest:
            return None
        return token_input

    def build(self, work, entries, fields) -> tuple[bytes, set[str]]:
        """The RESULT and its staged pack: each entry's kind says how its listing relates to
        what the pack holds; "fifo", "link" and "directory" make the pack itself one."""
        self.campaign.staging.mkdir(exist_ok=True)
        pack = Path(self.campaign.staged_pack(work.token))
        staged, named, packed, pack_kind = [], set(), [], None
        for kind, data, coverage, status, twice in entries:
            self.planted += 1
            data = b"planted %d " % self.planted + data
            digest = sha256_bytes(data)
            name, size = digest, len(data)
            if kind in ("fifo", "link", "directory"):
                pack_kind = kind
            if kind == "wrong-name":
                packed.append((digest, data[::-1]))
            elif kind != "missing":
                packed.append((digest, data))
            if kind == "upper-name":
                name = digest.upper()
            size = {"wrong-size": size + 1, "negative-size": -1}.get(kind, size)
            entry = {"digest": name, "size": size, "coverage": coverage, "status": status}
            staged += [entry, entry] if twice else [entry]
            named.add(digest)
        if pack.is_dir() and not pack.is_symlink():
            pack.rmdir()
        else:
            pack.unlink(missing_ok=True)  # a FIFO too: writing into one would block
        if pack_kind == "fifo":
            os.mkfifo(pack)
        elif pack_kind == "link":
            victim = self.campaign.out.parent / f"victim-{self.planted}"
            write_entries(victim, packed)
            pack.symlink_to(victim)
        elif pack_kind == "directory":
            pack.mkdir()
        elif packed:
            write_entries(pack, packed)
        message = {"token": work.token, "digest": work.digest, "outcome": "ok",
                   "exit_status": 0, "wall_time": 0.5, "solver_time": 0.1, "staged": staged,
                   "generated": len(staged)}
        for key, value in fields.items():
            if key == "digest":
                value = {"sent": work.digest, "other": "e" * 64, "junk": "../x"}[value]
            elif key == "token":
                value = {"other": "f" * 32, "junk": "../../x"}[value]
            message[key] = value
        return msgspec.msgpack.encode(message), named


@pytest.fixture
def quiet_master_log():
    loggers = [logging.getLogger(f"symcc_mpi.{name}") for name in ("master", "dispatch", "commit")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=MESSAGES, triage=st.booleans())
def test_nothing_a_worker_sends_breaks_the_master(tmp_path_factory, quiet_master_log,
                                                  messages, triage):
    rig = Rig(tmp_path_factory.mktemp("campaign") / "out", triage)
    try:
        for rank in WORKERS:
            rig.master.dispatch.ready(rank, None)
        rig.round()
        for shape, rank, body, fields in messages:
            work = rig.active(rank)
            before = set(os.listdir(rig.campaign.corpus))
            refused_before = sum(rig.master.stats.invalid_results.values())
            if shape == "bytes" or work is None:
                rig.master._handle(incoming(rank, body if shape == "bytes" else b"\x90"))
                named = set()
            else:
                payload, named = rig.build(work, body, fields)
                rig.master._handle(incoming(rank, payload))
            refused = sum(rig.master.stats.invalid_results.values()) > refused_before
            event("refused" if refused else "committed" if work is not None and
                  work.digest in rig.campaign.inputs.done else "other")
            rig.round()
            corpus = set(os.listdir(rig.campaign.corpus))
            for name in corpus:
                assert sha256_bytes((rig.campaign.corpus / name).read_bytes()) == name
            if refused:
                assert not (corpus - before) & named
                if work is not None and shape == "struct":
                    digest = work.digest
                    assert digest not in rig.campaign.inputs.done
                    assert digest in rig.campaign.inputs.pending or \
                        digest in rig.master.dispatch.recovery.deferred() or \
                        rig.master.dispatch.work_of(rank) == digest  # sent again already
    finally:
        rig.close()
