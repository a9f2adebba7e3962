"""The quiescence protocol's messages between masters (federation/quiescence.py runs it):
frozen, tagged, strictly decoded."""

from __future__ import annotations

from typing import Annotated

import msgspec

TOKEN_BYTES = 16  # 128 random bits: no two proposals of one job share a token
Token = Annotated[str, msgspec.Meta(pattern=f"^[0-9a-f]{{{2 * TOKEN_BYTES}}}$")]
SequenceNumber = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class Status(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="status"):
    """A master's state; `sequence` grows strictly with every status one master sends."""

    sequence: SequenceNumber
    idle: bool


class Prepare(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="prepare"):
    token: Token


class Vote(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="vote"):
    token: Token
    yes: bool  # False: BUSY


class Abort(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="abort"):
    token: Token


class Commit(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="commit"):
    token: Token


class Ack(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="ack"):
    token: Token
    committed: bool  # False: the COMMIT's token is not the one this master prepared


ControlMessage = Status | Prepare | Vote | Abort | Commit | Ack

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ControlMessage)


class MalformedControl(ValueError):
    """Bytes on the masters' communicator that are not a control message (one line)."""


def encode(message: ControlMessage) -> bytes:
    return _ENCODER.encode(message)


def decode(raw: bytes) -> ControlMessage:
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        reason = " ".join(str(error).split())
        raise MalformedControl(f"malformed control message: {reason}") from None
