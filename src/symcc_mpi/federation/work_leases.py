"""The work-lease table's records (F320 §2.2): one line of a shard's log (lease_log.py) each,
a JSON array, and the checks a line read back must pass before the table trusts it."""

from __future__ import annotations

import math
import re
from typing import Literal

import msgspec

from symcc_mpi.federation.shards import InvalidRecord, decode_record

WORK_SCHEMA = "symcc-work-lease-v1"
WORK_PAYLOAD_SCHEMA = "symcc-work-v1"

DIGEST = re.compile(r"[0-9a-f]{64}")

Origin = Literal["initial", "generated"]


class WorkPayload(msgspec.Struct, frozen=True, array_like=True):
    """F320 §2.2 payload: schema, the input's digest, and where it came from."""

    schema: str
    digest: str
    origin: Origin


class WorkLease(msgspec.Struct, frozen=True, array_like=True):
    """One work record (F320 §2.2). `status` only moves leased → committing → done; a line
    saying `abandoned` removes the record (F320 §2.3: a lease given up before its commit)."""

    schema: str
    digest: str
    status: Literal["leased", "committing", "done", "abandoned"]
    owner: str
    token: str
    updated: float  # wall clock, comparable across hosts
    expires: float  # wall clock; meaningful only while `leased` (committing is not stealable)
    attempts: int  # claims so far, takeovers included
    steals: int  # takeovers of an expired lease
    payload: WorkPayload

    def expired(self, now: float) -> bool:
        return self.status == "leased" and now >= self.expires


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise ValueError(f"a digest is a lowercase hex SHA-256 (got {digest!r})")
    return digest


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(WorkLease)


def decode_lease(raw: bytes) -> WorkLease:
    """A log line's record; InvalidRecord, saying why, if it is none or an impossible one."""
    record = decode_record(_DECODER, raw)
    problem = (
        "wrong schema" if record.schema != WORK_SCHEMA
        else "not a digest" if not DIGEST.fullmatch(record.digest)
        else "payload digest differs from the record's" if record.payload.digest != record.digest
        else "wrong payload schema" if record.payload.schema != WORK_PAYLOAD_SCHEMA
        else "empty token or owner" if not (record.token and record.owner)
        else "impossible counters" if not 0 <= record.steals < record.attempts
        else "non-finite time" if not (math.isfinite(record.updated)
                                       and math.isfinite(record.expires))
        else None
    )
    if problem:
        raise InvalidRecord(problem)
    return record


def encode_lease(record: WorkLease) -> bytes:
    return _ENCODER.encode(record) + b"\n"
