"""A worker's planned misbehaviour (faults.py, the hostile-worker tests): RESULTs under a
token it does not hold, with a hostile field, or not msgpack at all, each around a real staged
pack, so that the master's checks meet what a broken or hostile worker would send."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import msgspec

from symcc_mpi.campaign.corpus import sha256_bytes
from symcc_mpi.config import CampaignConfig
from symcc_mpi.coverage.edges import FileCoverage
from symcc_mpi.roles.faults import (
    HOSTILE_MARK,
    FaultKind,
    Faults,
    hold_until_released,
    stop_self,
)
from symcc_mpi.wire.protocol import PackChunk, Result, StagedFile, Tag
from symcc_mpi.wire.staging import Pack, Staged, write_entries
from symcc_mpi.wire.transport import Channel

MASTER = 0


def misbehave(channel: Channel, config: CampaignConfig, faults: Faults, number: int,
              result: Result, previous_token: str | None, received: float) -> bool:
    """The worker faults of faults.py planned after execution #`number`, whose RESULT is
    `result`; True when that RESULT is not to be sent."""
    if faults.fire(FaultKind.FOREIGN_RESULT, number):
        _send_unowned_result(channel, config, result, secrets.token_hex(16))
    if faults.fire(FaultKind.STALE_RESULT, number) and previous_token is not None:
        _send_unowned_result(channel, config, result, previous_token)
    if faults.paused_until_released(number):
        hold_until_released(config.out, faults.rank)
    elif faults.fire(FaultKind.PAUSE, number):
        stop_self(until=received + faults.pause_seconds(number))
    if hostile := faults.hostile_field(number):
        if hostile == "pack":  # a piece of its pack over MPI, out of order
            channel.send(MASTER, Tag.PACK, PackChunk(result.token, 1, HOSTILE_MARK, True),
                         ring=False)
        channel.send_raw(MASTER, Tag.RESULT, _hostile_result(config, result, hostile))
        return True
    if faults.fire(FaultKind.MALFORMED_RESULT, number):
        channel.send_raw(MASTER, Tag.RESULT, b"\xc1 not msgpack")
        return True
    return False


def _send_unowned_result(channel: Channel, config: CampaignConfig, real: Result,
                         token: str) -> None:
    """A RESULT under a token this rank does not hold now, with a real staged pack."""
    data = b"unowned result: must never reach the corpus " + secrets.token_bytes(8)
    planted = _plant(config.out / ".staging" / token, data)
    forged = Result(token=token, digest=real.digest, outcome="ok", exit_status=0,
                    wall_time=0.0, solver_time=0.0,
                    staged=[StagedFile(planted.digest, planted.size)], generated=1)
    channel.send(MASTER, Tag.RESULT, forged)


def _plant(pack: Path, data: bytes, *, corrupt: bool = False) -> Staged:
    """Add `data` as the last child of the pack `pack` (made if there is none). `corrupt`:
    the bytes packed are not those the index names."""
    children = []
    if pack.exists():
        with Pack(str(pack)) as existing:
            children = [(entry.digest, existing.read(entry.digest))
                        for entry in existing.entries]
    digest = sha256_bytes(data)
    offset = sum(len(content) for _, content in children)
    write_entries(pack, [*children, (digest, data[::-1] if corrupt else data)])
    return Staged(digest, offset, len(data))


def _hostile_result(config: CampaignConfig, real: Result, field: str) -> bytes:
    """The RESULT of `real`'s dispatch with `field` made hostile (faults.py), as raw msgpack:
    around a child planted in its staged pack, listed after the real children."""
    pack = config.out / ".staging" / real.token
    data = HOSTILE_MARK + secrets.token_bytes(8)
    if field == "missing-file":
        digest = sha256_bytes(data)  # listed, never packed
    else:
        digest = _plant(pack, data, corrupt=field == "staged-bytes").digest
    planted = {"digest": digest, "size": len(data), "coverage": None, "status": "ok"}
    message = msgspec.to_builtins(real, builtin_types=(bytes,))
    if config.afl_target:  # the campaign triages: an honest summary (no edge) to spoil
        planted["coverage"] = FileCoverage.from_pairs([]).pack()
    entries = [planted]
    if field == "outcome":
        message["outcome"] = "pwned"
    elif field == "status":
        planted["status"] = "pwned"
    elif field == "coverage":
        # Valid alone, but an edge one past the map: the master must not grow its maps.
        planted["coverage"] = FileCoverage.from_pairs([(1 << 16, 1)], map_size=1 << 16).pack()
    elif field == "manifest-length":
        message["generated"] = len(real.staged)  # one entry more than it generated
    elif field == "size":
        planted["size"] = -1
    elif field == "name":
        planted["digest"] = digest.upper()
    elif field == "duplicate":
        entries.append(dict(planted))
    elif field == "not-regular":
        pack.unlink()
        os.mkfifo(pack)  # opening it for reading would block the master for ever
    elif field == "figures":
        message["wall_time"] = -1.0
    elif field == "digest":
        message["digest"] = sha256_bytes(data)
    elif field == "pruning":
        message["pruning"] = b"\xc1 not a delta"
    elif field == "generation":
        message["generation"] += 1
    elif field == "targets":
        message["path_targets"] = [0, -1]  # targets are positive
    if field != "manifest-length":
        message["generated"] += len(entries)
    message["staged"] = message["staged"] + entries  # the pack's index has it last
    return msgspec.msgpack.encode(message)
