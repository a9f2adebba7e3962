"""Only regular files are test cases: what executors list, what a worker stages, and the
helpers under both (`regular.py`). Symlinks (to /etc/passwd, to /dev/null, to a file outside
the campaign), FIFOs, directories, sockets and devices are skipped unread, and nothing
blocks on a FIFO. Tests that could block run under pytest-timeout."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

import pytest

from symcc_mpi.durable.regular import NotRegularFile, list_regular, open_regular
from symcc_mpi.executors.symcc import SymccExecutor
from symcc_mpi.roles.execute import SkippedEntries
from symcc_mpi.wire.protocol import ResultField
from symcc_mpi.wire.staging import Pack, PackRejected, write_entries, write_pack

pytestmark = pytest.mark.timeout(60)

SECRET = b"a file outside the campaign: must never be staged\n"


def plant_hostile_entries(directory: Path, outside: Path) -> None:
    """Everything but a regular file, as a target could leave it in SYMCC_OUTPUT_DIR."""
    (directory / "passwd").symlink_to("/etc/passwd")
    (directory / "outside").symlink_to(outside)
    (directory / "null").symlink_to("/dev/null")
    (directory / "dangling").symlink_to(directory / "nothing-here")
    os.mkfifo(directory / "fifo")
    (directory / "subdir").mkdir()
    (directory / "subdir" / "nested").write_bytes(b"not at the top level")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(directory / "socket"))
    server.close()


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside-secret"
    path.write_bytes(SECRET)
    return path


@pytest.fixture
def hostile(tmp_path, outside):
    directory = tmp_path / "generated"
    directory.mkdir()
    plant_hostile_entries(directory, outside)
    (directory / "000000").write_bytes(b"a real test case")
    return directory


def test_listing_keeps_regular_files_and_counts_the_rest_by_kind(hostile):
    listing = list_regular(hostile)
    assert [p.name for p in listing.files] == ["000000"]
    assert listing.skipped == {"symlink": 4, "FIFO": 1, "directory": 1, "socket": 1}


def test_listing_skips_hidden_files_uncounted_when_asked(hostile):
    (hostile / ".000001").write_bytes(b"still being written")
    assert [p.name for p in list_regular(hostile).files] == [".000001", "000000"]
    assert [p.name for p in list_regular(hostile, skip_hidden=True).files] == ["000000"]


def test_a_device_node_is_skipped(tmp_path):
    directory = tmp_path / "generated"
    directory.mkdir()
    try:
        os.mknod(directory / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    assert list_regular(directory).skipped == {"character device": 1}
    with pytest.raises(NotRegularFile, match="character device"):
        open_regular(directory / "null")


def test_an_unreadable_directory_lists_nothing(tmp_path):
    listing = list_regular(tmp_path / "absent")
    assert listing.files == () and not listing.skipped


@pytest.mark.parametrize("name, kind", [("passwd", "symlink"), ("outside", "symlink"),
                                        ("null", "symlink"), ("fifo", "FIFO"),
                                        ("subdir", "directory"), ("socket", "socket")])
def test_open_refuses_what_is_not_a_regular_file_without_blocking(hostile, name, kind):
    with pytest.raises(NotRegularFile) as refused:
        open_regular(hostile / name)
    assert refused.value.kind == kind


def test_open_through_a_directory_descriptor(hostile):
    directory = os.open(hostile, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, status = open_regular("000000", dir_fd=directory)
        os.close(fd)
        assert stat.S_ISREG(status.st_mode)
        with pytest.raises(NotRegularFile):
            open_regular("passwd", dir_fd=directory)
    finally:
        os.close(directory)


def test_symcc_executor_collects_regular_files_only(tmp_path, outside):
    """A target that plants links, a FIFO, a directory and a socket beside a test case."""
    target = tmp_path / "target.sh"
    target.write_text(
        "#!/bin/sh\n"
        'cd "$SYMCC_OUTPUT_DIR"\n'
        "printf 'generated' > 000000\n"
        "ln -s /etc/passwd passwd\n"
        f"ln -s {outside} outside\n"
        "ln -s /dev/null null\n"
        "mkfifo fifo\n"
        "mkdir subdir\n")
    target.chmod(0o755)
    inp, out = tmp_path / "input", tmp_path / "out"
    inp.write_bytes(b"x")
    out.mkdir()
    result = SymccExecutor([str(target)], timeout=10).run(inp, out)
    assert [p.name for p in result.generated] == ["000000"]
    assert dict(result.skipped) == {"FIFO": 1, "directory": 1, "symlink": 3}


def packed(pack: Path) -> dict[str, bytes]:
    """A pack's children, read back the way the master reads them."""
    with Pack(str(pack)) as opened:
        return {entry.digest: opened.read(entry.digest) for entry in opened.entries}


def test_worker_packs_regular_files_under_the_digest_of_the_bytes_it_copied(tmp_path,
                                                                           hostile):
    pack = tmp_path / "pack"
    # The executor's listing, then every entry swapped or not: the worker must re-check.
    paths = [hostile / name for name in sorted(os.listdir(hostile))]
    staged, refused = write_pack(paths, pack, "0" * 64)
    digest = hashlib.sha256(b"a real test case").hexdigest()
    assert [entry.digest for entry in staged] == [digest]
    assert packed(pack) == {digest: b"a real test case"}
    assert refused == {"symlink": 4, "FIFO": 1, "directory": 1, "socket": 1}
    assert SECRET not in pack.read_bytes()
    assert Path("/etc/passwd").read_bytes() not in pack.read_bytes()


def test_worker_staging_copies_rather_than_links(tmp_path):
    """A link would keep the inode the target may still hold open and write."""
    source = tmp_path / "000000"
    source.write_bytes(b"first bytes")
    (entry,), _ = write_pack([source], tmp_path / "pack", "0" * 64)
    with open(source, "ab") as late_writer:
        late_writer.write(b" and more")
    assert packed(tmp_path / "pack") == {entry.digest: b"first bytes"}
    assert entry.digest == hashlib.sha256(b"first bytes").hexdigest()


def test_worker_staging_drops_duplicates_and_the_input_itself(tmp_path):
    for name, data in (("a", b"same"), ("b", b"same"), ("c", b"the input"), ("d", b"other")):
        (tmp_path / name).write_bytes(data)
    staged, _ = write_pack([tmp_path / n for n in "abcd"], tmp_path / "pack",
                           hashlib.sha256(b"the input").hexdigest())
    assert [entry.digest for entry in staged] == [hashlib.sha256(b"same").hexdigest(),
                                                  hashlib.sha256(b"other").hexdigest()]
    assert [(entry.offset, entry.size) for entry in staged] == [(0, 4), (4, 5)]
    assert packed(tmp_path / "pack") == {entry.digest: data for entry, data
                                         in zip(staged, (b"same", b"other"), strict=True)}


def test_a_run_without_children_makes_no_pack(tmp_path, hostile):
    staged, _ = write_pack([hostile / "passwd", hostile / "fifo"], tmp_path / "pack", "0" * 64)
    assert staged == [] and not (tmp_path / "pack").exists()


@pytest.mark.parametrize("damage", ["truncated", "no index", "short data", "empty"])
def test_a_damaged_pack_is_refused_when_opened(tmp_path, damage):
    pack = tmp_path / "pack"
    write_entries(pack, [(hashlib.sha256(b"x" * 50).hexdigest(), b"x" * 50)])
    raw = pack.read_bytes()
    pack.write_bytes({"truncated": raw[:-3], "no index": b"x" * 50, "short data": raw[10:],
                      "empty": b""}[damage])
    with pytest.raises(PackRejected) as rejected:
        Pack(str(pack))
    assert rejected.value.field is ResultField.MISSING_FILE


def test_skipped_entries_warn_once_per_kind_and_total_at_the_end(caplog):
    skipped = SkippedEntries(rank=3)
    with caplog.at_level("WARNING"):
        skipped.note([("symlink", 2)])
        skipped.note([("symlink", 1), ("FIFO", 1)])
        skipped.note([])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "rank 3" in warnings[0] and "symlink" in warnings[0]
    assert "FIFO" in warnings[1]
    assert skipped.summary() == "1 FIFO, 3 symlink"
