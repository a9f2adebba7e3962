"""Packs over MPI (campaign/uploads.py, roles/worker.py's `upload`): a worker's pieces, the
master's checks of them, and the pack the commit reads after them."""

from __future__ import annotations

import hashlib
import os

import pytest

from symcc_mpi.campaign.uploads import PackUploads
from symcc_mpi.config import CampaignConfig
from symcc_mpi.roles.worker import Worker, upload
from symcc_mpi.wire.protocol import PACK_CHUNK, UPLOAD_WINDOW, PackChunk, Tag, decode, encode
from symcc_mpi.wire.staging import Pack, write_pack

TOKEN = "ab" * 16
OTHER = "cd" * 16


class Recorder:
    """The two calls `upload` makes of a channel: what it sends, and how far it lets sends
    pile up (a real channel's sends complete when the master takes them)."""

    def __init__(self):
        self.sent: list[PackChunk] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def send(self, dest, tag, message, *, ring=True):
        assert tag is Tag.PACK and not ring
        self.sent.append(decode(tag, encode(message)))  # as the master decodes it
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def wait_sends(self, keep, ring=None):
        self.in_flight = min(self.in_flight, keep)


@pytest.fixture
def staging(tmp_path):
    directory = tmp_path / "staging"
    directory.mkdir()
    return directory


def pieces_of(tmp_path, children: list[bytes]) -> tuple[list[PackChunk], list]:
    sources = []
    for number, data in enumerate(children):
        (path := tmp_path / f"child{number}").write_bytes(data)
        sources.append(path)
    staged, _ = write_pack(sources, tmp_path / "pack", parent="0" * 64)
    channel = Recorder()
    upload(channel, 0, TOKEN, tmp_path / "pack")
    assert channel.most_in_flight <= UPLOAD_WINDOW
    return channel.sent, staged


def test_a_pack_in_pieces_is_the_pack_the_commit_reads(tmp_path, staging):
    children = [b"small child", os.urandom(PACK_CHUNK + 5), os.urandom(2 * PACK_CHUNK)]
    pieces, staged = pieces_of(tmp_path, children)
    assert len(pieces) == 4 and [p.last for p in pieces] == [False] * 3 + [True]
    assert all(len(p.data) <= PACK_CHUNK for p in pieces)
    uploads = PackUploads(str(staging))
    for piece in pieces:
        uploads.receive(1, piece, holds=TOKEN)
    assert uploads.problem(1, TOKEN) is None
    assert uploads.written(TOKEN) and not uploads.written(TOKEN)
    with Pack(str(staging / TOKEN)) as pack:
        assert [pack.read(entry.digest) for entry in staged] == children
    assert uploads.figures() == {"packs": 1, "bytes": (tmp_path / "pack").stat().st_size,
                                 "refused": 0, "stale_pieces": 0}


def test_a_piece_of_a_dispatch_the_rank_does_not_hold_is_dropped(tmp_path, staging):
    pieces, _ = pieces_of(tmp_path, [b"child"])
    uploads = PackUploads(str(staging))
    uploads.receive(1, pieces[0], holds=OTHER)
    uploads.receive(1, pieces[0], holds=None)
    assert list(staging.iterdir()) == []
    assert uploads.figures()["stale_pieces"] == 2
    assert uploads.problem(1, TOKEN) is None and not uploads.written(TOKEN)


@pytest.mark.parametrize("spoil, why", [
    (lambda p: PackChunk(p.token, p.offset + 1, p.data, p.last), "a piece at byte 1, 0 expected"),
    (lambda p: PackChunk(p.token, p.offset, p.data + bytes(PACK_CHUNK), p.last), "over"),
])
def test_a_piece_out_of_order_or_too_large_refuses_the_pack(tmp_path, staging, spoil, why):
    pieces, _ = pieces_of(tmp_path, [b"child"])
    uploads = PackUploads(str(staging))
    uploads.receive(1, spoil(pieces[0]), holds=TOKEN)
    uploads.receive(1, pieces[0], holds=TOKEN)  # a refused pack stays refused
    assert list(staging.iterdir()) == []
    assert why in uploads.problem(1, TOKEN)
    assert not uploads.written(TOKEN)
    assert uploads.figures()["refused"] == 1


def test_a_pack_that_did_not_arrive_whole_is_refused_at_its_result(tmp_path, staging):
    pieces, _ = pieces_of(tmp_path, [os.urandom(PACK_CHUNK + 1)])
    uploads = PackUploads(str(staging))
    uploads.receive(1, pieces[0], holds=TOKEN)
    assert uploads.problem(1, TOKEN) == f"the pack stopped at byte {PACK_CHUNK}"
    assert not uploads.written(TOKEN)


def test_a_pack_left_unfinished_by_an_earlier_dispatch_does_not_mix_with_the_next(tmp_path,
                                                                               staging):
    pieces, _ = pieces_of(tmp_path, [os.urandom(PACK_CHUNK + 1)])
    uploads = PackUploads(str(staging))
    uploads.receive(1, PackChunk(OTHER, 0, b"x" * 10, False), holds=OTHER)
    for piece in pieces:
        uploads.receive(1, piece, holds=TOKEN)
    assert uploads.problem(1, TOKEN) is None and uploads.written(TOKEN)
    assert (staging / TOKEN).read_bytes() == (tmp_path / "pack").read_bytes()


def test_a_link_where_the_pack_goes_is_not_followed(tmp_path, staging):
    victim = tmp_path / "victim"
    victim.write_bytes(b"not to be overwritten")
    (staging / TOKEN).symlink_to(victim)
    pieces, _ = pieces_of(tmp_path, [b"child"])
    uploads = PackUploads(str(staging))
    uploads.receive(1, pieces[0], holds=TOKEN)
    assert "symbolic link" in uploads.problem(1, TOKEN)
    assert victim.read_bytes() == b"not to be overwritten"
    assert not os.path.lexists(staging / TOKEN)


def test_the_bytes_over_mpi_are_checked_against_their_sha256_at_the_commit(tmp_path,
                                                                           staging):
    pieces, staged = pieces_of(tmp_path, [b"honest child"])
    spoiled = bytearray(pieces[0].data)
    spoiled[0] ^= 0xFF
    uploads = PackUploads(str(staging))
    uploads.receive(1, PackChunk(TOKEN, 0, bytes(spoiled), True), holds=TOKEN)
    assert uploads.problem(1, TOKEN) is None  # whole: the commit's reader checks the bytes
    with Pack(str(staging / TOKEN)) as pack, pytest.raises(Exception, match="SHA-256"):
        pack.read(staged[0].digest)
    assert staged[0].digest == hashlib.sha256(b"honest child").hexdigest()


@pytest.mark.parametrize("via, sees, over_mpi, refused", [
    ("auto", True, False, False), ("auto", False, True, False),
    ("mpi", True, True, False), ("mpi", False, True, False),
    ("files", True, False, False), ("files", False, False, True),
])
def test_the_path_a_worker_takes_for_its_packs(tmp_path, via, sees, over_mpi, refused):
    out = tmp_path / "out"
    (out / ".staging").mkdir(parents=True)
    marker = ".master-0123456789abcdef"
    if sees:
        (out / ".staging" / marker).touch()
    config = CampaignConfig(target=("/bin/true", "@@"), seeds=None, out=out, executor="noop",
                            results_via=via)
    worker = Worker(1, config)
    try:
        taken, problem = worker._results_path(marker)
        assert taken == over_mpi
        assert problem.startswith(f"rank 1 does not see --out {out}") if refused \
            else problem == ""
        assert worker.sees_out == sees
    finally:
        worker.close()
