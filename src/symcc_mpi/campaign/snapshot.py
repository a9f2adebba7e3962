"""What a campaign's master knew when it closed cleanly, saved so that `--resume` starts at
once: a million analysed inputs are not read back from the journal, corpus/ and queue/.

Without it, a resume replays the whole done journal and lists corpus/ and queue/ (21 s for a
million inputs on these VMs, cold). The snapshot (`state/resume.snapshot`) holds the
frontier's digest table as its buffers (every input's flags, depth and queue id, and the
table's index: no rehash), the AFL ids in use, the crashes and hangs known, and the size,
SHA-256 and last bytes of the done journal it covers. It is written by a lone master at the
end of a clean close, after the journal's last sync and its check that nobody else wrote it.

It is used once: the next run takes it (and removes it, durably, before anything is
published) only if the journal is still exactly the one it covers; else, or after any run
that did not close cleanly, the journal and the directories are read as before. So a
snapshot never vouches for files a later run published. A snapshot that does not decode or
fit is set aside in quarantine/ with one warning and the slow path runs.
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from symcc_mpi.durable.atomic import fsync_directory, write_durable

log = logging.getLogger("symcc_mpi.campaign.snapshot")

SNAPSHOT_FILE = "resume.snapshot"
VERSION = 1
_TAIL = 64  # bytes of the journal's end kept to recognise it


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


def save(campaign, journal_size: int, journal_lines: int, journal_sha256: str) -> None:
    """Write the snapshot of `campaign` (corpus.CampaignDir), whose journal was just found to
    be `journal_size` bytes and `journal_lines` records of SHA-256 `journal_sha256`."""
    with open(campaign.done_journal, "rb") as handle:
        handle.seek(max(0, journal_size - _TAIL))
        tail = handle.read(_TAIL)
    ids = campaign.next_ids
    state = _State(VERSION, journal_size, journal_lines, journal_sha256, tail, campaign.epoch,
                   [ids["queue"], ids["crashes"], ids["hangs"]],
                   b"".join(bytes.fromhex(d) for d in sorted(campaign.crash_digests)),
                   b"".join(bytes.fromhex(d) for d in sorted(campaign.hang_digests)),
                   [(bytes.fromhex(d), name) for d, name in campaign.queue_names.items()],
                   campaign.inputs.dump())
    payload = msgspec.msgpack.encode(state)
    write_durable(campaign.state / SNAPSHOT_FILE, b"%08x" % zlib.crc32(payload) + payload)


def take(campaign) -> Snapshot | None:
    """The snapshot of the journal as it is now, removed from OUT (it serves once); None
    when there is none or it does not cover this journal."""
    path: Path = campaign.state / SNAPSHOT_FILE
    snapshot = _read(campaign)
    if not path.exists():
        return None
    path.unlink()
    fsync_directory(path.parent)  # gone before this run publishes anything it does not cover
    if snapshot is not None and not _covers(snapshot, campaign.done_journal):
        log.info("%s covers another journal than %s: reading the journal", path,
                 campaign.done_journal)
        return None
    return snapshot


def covers_journal(campaign) -> bool:
    """Whether a snapshot that covers the journal as it is waits for the next run (which
    then need not read the journal to check it); changes nothing."""
    try:
        snapshot = _decode((campaign.state / SNAPSHOT_FILE).read_bytes())
    except (OSError, ValueError):
        return False
    return _covers(snapshot, campaign.done_journal)


def _read(campaign) -> Snapshot | None:
    path: Path = campaign.state / SNAPSHOT_FILE
    try:
        return _decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as error:
        log.warning("%s is unreadable (%s): set aside, reading the journal instead", path,
                    error)
        campaign.quarantine.mkdir(exist_ok=True)
        os.replace(path, campaign.quarantine / SNAPSHOT_FILE)
        return None


def _decode(raw: bytes) -> Snapshot:
    if len(raw) < 8 or raw[:8] != b"%08x" % zlib.crc32(raw[8:]):
        raise ValueError("checksum mismatch")
    try:
        state = msgspec.msgpack.decode(raw[8:], type=_State)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ValueError(str(error)) from None
    if state.version != VERSION or len(state.next_ids) != 3 or len(state.table) != 5 \
            or len(state.crashes) % 32 or len(state.hangs) % 32:
        raise ValueError("not a snapshot of this version")
    return Snapshot(state.journal_size, state.journal_lines, state.journal_sha256,
                    state.journal_tail, state.epoch,
                    dict(zip(("queue", "crashes", "hangs"), state.next_ids, strict=True)),
                    _digests(state.crashes), _digests(state.hangs),
                    {key.hex(): name for key, name in state.queue_names}, state.table)


def _covers(snapshot: Snapshot, journal: Path) -> bool:
    """Whether the journal is still exactly the one the snapshot was taken of."""
    try:
        with open(journal, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() != snapshot.journal_size:
                return False
            handle.seek(max(0, snapshot.journal_size - _TAIL))
            return handle.read(_TAIL) == snapshot.journal_tail
    except FileNotFoundError:
        return snapshot.journal_size == 0


def _digests(raw: bytes) -> set[str]:
    return {raw[i:i + 32].hex() for i in range(0, len(raw), 32)}
