"""What a campaign's lone master knew at a point of its run, saved so that `--resume` starts
at once: a million analysed inputs are not read back from the journal, corpus/ and queue/.

Without it, a resume replays the whole done journal and lists corpus/ and queue/ (21 s for a
million inputs on these VMs, cold). The snapshot (`state/resume.snapshot`) holds the
frontier's digest table as its buffers (every input's flags, depth and queue id, and the
table's index: no rehash), the AFL ids in use, the crashes and hangs known, the work in
flight, and the size, SHA-256 (when known without reading the file) and last bytes of the
done journal it covers. The master writes one right after a group commit, once early in
its run and then as campaign/checkpoint.py paces it, and one at the end of a clean close.

It is used once: the next run takes it and removes it, durably, before anything is
published. It serves when the journal still begins with the records it covers: either the
journal ends there and it was taken by a clean close (everything it covers is synced, and
nothing was published after it: on any boot), or the run that took it went on and died, on
this very boot. Then the records after it are replayed
and what was published after it is found in its publish log (published.py), which lives in
the same page cache as the files. Otherwise (another boot: unsynced lines may be lost in any
order; records that begin an epoch or split an input after it; a journal compacted since)
the journal and the directories are read as before. A snapshot that does not decode or fit
is set aside in quarantine/ with one warning and the slow path runs.
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from symcc_mpi.durable.atomic import fsync_directory, make_directories, write_durable

log = logging.getLogger("symcc_mpi.campaign.snapshot")
# Records a resume from a snapshot does not replay: the slow path handles them.
_NOT_AFTER = {"epoch": "begins an epoch", "part": "is a part of a split input"}

SNAPSHOT_FILE = "resume.snapshot"
VERSION = 2  # 1: a clean close's, with no publish log, boot or work in flight
_TAIL = 64  # bytes of the journal's end kept to recognise it
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class _State(msgspec.Struct, array_like=True):
    version: int
    journal_size: int
    journal_lines: int
    journal_sha256: str
    journal_tail: bytes
    epoch: int
    next_ids: list[int]  # queue, crashes, hangs
    crashes: bytes  # raw digests, 32 bytes each
    hangs: bytes
    queue_names: list[tuple[bytes, str]]  # a hybrid campaign's (afl_sync.helper_rank)
    table: list[bytes]  # frontier.Frontier.dump()
    boot_id: str = ""  # of the machine that wrote it
    publish_serial: int = 0  # its publish log (published.py)
    in_flight: list[str] = []  # work ids (splitting.py) dispatched, not committed
    closed: bool = True  # taken by a clean close (version 1 was only ever)


@dataclass(frozen=True)
class Snapshot:
    journal_size: int
    journal_lines: int
    journal_sha256: str
    journal_tail: bytes
    epoch: int
    next_ids: dict[str, int]
    crashes: set[str]
    hangs: set[str]
    queue_names: dict[str, str]
    table: list[bytes]
    boot_id: str
    publish_serial: int
    in_flight: list[str]
    closed: bool


def save(campaign, journal_size: int, journal_lines: int, journal_sha256: str, *,
         publish_serial: int, in_flight: list[str], closed: bool) -> None:
    """Write the snapshot of `campaign` (corpus.CampaignDir), whose journal is `journal_size`
    bytes and `journal_lines` records of SHA-256 `journal_sha256` ("": not known), with the
    work `in_flight`; what is published next goes to the log of `publish_serial`. `closed`:
    taken by a clean close, after which nothing is published."""
    with open(campaign.done_journal, "rb") as handle:
        handle.seek(max(0, journal_size - _TAIL))
        tail = handle.read(min(_TAIL, journal_size))
    ids = campaign.next_ids
    state = _State(VERSION, journal_size, journal_lines, journal_sha256, tail, campaign.epoch,
                   [ids["queue"], ids["crashes"], ids["hangs"]],
                   b"".join(bytes.fromhex(d) for d in sorted(campaign.crash_digests)),
                   b"".join(bytes.fromhex(d) for d in sorted(campaign.hang_digests)),
                   [(bytes.fromhex(d), name) for d, name in campaign.queue_names.items()],
                   campaign.inputs.dump(), boot_id(), publish_serial, in_flight, closed)
    payload = msgspec.msgpack.encode(state)
    write_durable(campaign.state / SNAPSHOT_FILE, b"%08x" % zlib.crc32(payload) + payload)


def take(campaign) -> Snapshot | None:
    """The snapshot that serves the journal as it is now, removed from OUT (it serves once);
    None when there is none or it cannot serve (said in the log)."""
    path: Path = campaign.state / SNAPSHOT_FILE
    snapshot = _read(campaign)
    if not path.exists():
        return None
    path.unlink()
    fsync_directory(path.parent)  # gone before this run publishes anything it does not cover
    if snapshot is None:
        return None
    why_not = _why_not(snapshot, campaign.done_journal)
    if why_not:
        log.info("%s: %s: reading the journal and listing corpus/ instead", path, why_not)
        return None
    return snapshot


def boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""  # unknown: only a clean close's snapshot serves (see _why_not)


def serving(campaign) -> Snapshot | None:
    """The snapshot the next run will take and use, if there is one: the records it covers
    need not be read to be checked. Changes nothing."""
    try:
        snapshot = _decode((campaign.state / SNAPSHOT_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return None if _why_not(snapshot, campaign.done_journal) else snapshot


def _read(campaign) -> Snapshot | None:
    path: Path = campaign.state / SNAPSHOT_FILE
    try:
        return _decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as error:
        log.warning("%s is unreadable (%s): set aside, reading the journal instead", path,
                    error)
        make_directories(campaign.quarantine)
        os.replace(path, campaign.quarantine / SNAPSHOT_FILE)
        return None


def _decode(raw: bytes) -> Snapshot:
    if len(raw) < 8 or raw[:8] != b"%08x" % zlib.crc32(raw[8:]):
        raise ValueError("checksum mismatch")
    try:
        state = msgspec.msgpack.decode(raw[8:], type=_State)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ValueError(str(error)) from None
    if state.version not in (1, VERSION) or len(state.next_ids) != 3 or len(state.table) != 5 \
            or len(state.crashes) % 32 or len(state.hangs) % 32:
        raise ValueError("not a snapshot of this version")
    return Snapshot(state.journal_size, state.journal_lines, state.journal_sha256,
                    state.journal_tail, state.epoch,
                    dict(zip(("queue", "crashes", "hangs"), state.next_ids, strict=True)),
                    _digests(state.crashes), _digests(state.hangs),
                    {key.hex(): name for key, name in state.queue_names}, state.table,
                    state.boot_id, state.publish_serial, state.in_flight, state.closed)


def _covers(snapshot: Snapshot, journal: Path) -> bool | None:
    """True if the journal is still exactly the one the snapshot was taken of, None if it
    begins with it and goes on, False if it does not begin with it."""
    try:
        with open(journal, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size < snapshot.journal_size:
                return False
            handle.seek(max(0, snapshot.journal_size - _TAIL))
            if handle.read(min(_TAIL, snapshot.journal_size)) != snapshot.journal_tail:
                return False
            return True if size == snapshot.journal_size else None
    except FileNotFoundError:
        return snapshot.journal_size == 0


def _why_not(snapshot: Snapshot, journal: Path) -> str:
    """Why the snapshot cannot serve the journal as it is ("" if it can)."""
    covers = _covers(snapshot, journal)
    if covers is False:
        return f"it covers another journal than {journal}"
    # What a run published after its snapshot is known from unsynced lines: only on the
    # boot that wrote them are they sure to be there with every file they name.
    if (covers is None or not snapshot.closed) \
            and (not snapshot.boot_id or snapshot.boot_id != boot_id()):
        return ("the run that took it went on before this machine last started: what it "
                "wrote after it may not have reached the disk whole")
    if covers:
        return ""
    with open(journal, "rb") as handle:
        handle.seek(snapshot.journal_size)
        after = handle.read()
    for kind, why in _NOT_AFTER.items():
        # The records' JSON has sorted keys and no spaces (durable/lines.py), and a quote
        # inside a string is escaped: only a record of that kind holds these bytes.
        if b'"kind":"%s"' % kind.encode() in after:
            return f"a record after it {why}"
    return ""


def _digests(raw: bytes) -> set[str]:
    return {raw[i:i + 32].hex() for i in range(0, len(raw), 32)}
