"""Envelopes decode strictly: anything but the exact type for its tag is malformed."""

import msgspec
import pytest

from symcc_mpi.wire.protocol import (
    MalformedMessage,
    Ready,
    Result,
    StagedFile,
    Tag,
    Work,
    decode,
    encode,
)

H = "ab" * 32
TOKEN = "0123456789abcdef" * 2


def test_round_trip_every_field():
    result = Result(token=TOKEN, digest=H, outcome="ok", exit_status=0, wall_time=0.5,
                    solver_time=0.1, staged=[StagedFile(H, 3, b"\x01\x02", "crash")],
                    generated=4, message="m")
    assert decode(Tag.RESULT, encode(result)) == result
    assert decode(Tag.READY, encode(Ready(None))) == Ready(None)


@pytest.mark.parametrize("tag, payload", [
    (Tag.RESULT, encode(Work(TOKEN, H))),  # right bytes for another tag
    (Tag.WORK, b"\xff\x00garbage"),
    (Tag.WORK, msgspec.msgpack.encode({"token": TOKEN, "digest": H, "extra": 1})),
    (Tag.WORK, msgspec.msgpack.encode({"token": "../../etc", "digest": H})),
    (Tag.WORK, msgspec.msgpack.encode({"token": TOKEN, "digest": "short"})),
    (Tag.READY, msgspec.msgpack.encode({"token": 7})),
    (99, encode(Ready(None))),
])
def test_malformed_is_refused(tag, payload):
    with pytest.raises(MalformedMessage):
        decode(tag, payload)


def test_pickle_is_never_accepted():
    import pickle

    with pytest.raises(MalformedMessage):
        decode(Tag.READY, pickle.dumps(Ready(None)))


def test_bad_staged_entry_is_refused():
    bad = Result(token=TOKEN, digest=H, outcome="ok", exit_status=0, wall_time=0,
                 solver_time=0, staged=[StagedFile("../x", 1)], generated=1)
    with pytest.raises(MalformedMessage):
        decode(Tag.RESULT, encode(bad))
