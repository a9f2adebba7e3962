"""Whole-file durable writes: temp file in the same directory, fsync, rename, directory fsync.

The package's one atomic-write helper (the campaign marker, corpus and queue files, the
triage checkpoint, pruning maps, journal repairs, quarantine copies, the stop request and the
AFL report files); `publish_link` is its variant for a name that is a hard link to another
file (AFL's queue/), and `fsync_once` the group commit's deferred fsync. A reader sees the
old bytes or the new bytes, never a mix; after `write_durable` returns the new bytes survive
a crash of the machine. A process killed mid-write leaves at most a dot-named temporary file,
which `is_temporary` recognises so scans can skip and sweep it.

Filesystem semantics relied on: `rename` within one directory replaces the target atomically
(POSIX; NFS too, the server performs it as one operation), and `fsync` of a file and then of
its directory makes the data and the new name durable. The temporary name carries the pid
and a count of the process's writes, so no two writers of one target (processes, or threads
of one) share a temporary; the last rename wins.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

TEMPORARY_PREFIX = ".tmp-"


class SystemDisk:
    """The process's durable writes (journal appends and every fsync): the system's, unless
    the deterministic simulation (tests/simulation) points `source` at a disk that fails,
    tears or stalls them."""

    def __init__(self) -> None:
        self.source = os  # anything with write(fd, data) and fsync(fd)

    def write(self, fd: int, data) -> int:
        return self.source.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.source.fsync(fd)


SYSTEM_DISK = SystemDisk()


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        SYSTEM_DISK.fsync(fd)
    finally:
        os.close(fd)


def make_directories(path: Path) -> None:
    """`mkdir -p` whose directories survive a crash of the machine: a name made in a
    directory is durable once that directory is fsynced, so each one made is fsynced into
    its parent (the campaign's own directory included: else a crash may take all of it)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            pass  # made meanwhile by another process, perhaps not yet durable: fsync anyway
        fsync_directory(directory.parent)


_writes = itertools.count()


def temporary_for(path: Path) -> Path:
    """The name a new durable write of `path` stages its bytes under."""
    return path.with_name(f"{TEMPORARY_PREFIX}{path.name}.{os.getpid()}.{next(_writes)}")


def write_durable(path: Path, data: bytes, *, fsync: bool = True,
                  exclusive: bool = False) -> bool:
    """`exclusive`: only if `path` does not exist yet (a link, not a rename: of two writers
    exactly one creates it); False when it did. Else the last rename wins; True."""
    temporary = temporary_for(path)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[SYSTEM_DISK.write(fd, view):]
            if fsync:
                SYSTEM_DISK.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False
            finally:
                temporary.unlink(missing_ok=True)
        else:
            os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)  # a full disk must not leave half a file behind
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a failed flush names no file: say which
        raise
    if fsync:
        fsync_directory(path.parent)
    return True


def publish_link(source: str | Path, target: str | Path, *, replace: bool = False) -> None:
    """Make `target` appear whole with the bytes of `source`: a hard link, or where the
    filesystem refuses one, a copy under a temporary name renamed onto `target` (AFL's sync
    reads any id: name it sees). `replace`: `target` exists and is swapped for the new link
    in one rename. Not fsynced: the caller's group commit does that."""
    if not replace:
        try:
            os.link(source, target)  # the master's path per kept child: no Path built
            return
        except OSError:
            pass
    temporary = temporary_for(Path(target))
    if replace:
        try:
            os.link(source, temporary)
            os.replace(temporary, target)
            return
        except OSError:
            temporary.unlink(missing_ok=True)
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def fsync_once(path: str, synced: set[tuple[int, int]]) -> None:
    """Make a file's data durable unless its inode is in `synced` (a hard link's other name
    was synced already); a file gone since is skipped: nothing is left to vouch for."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) not in synced:
            SYSTEM_DISK.fsync(fd)
            synced.add((info.st_dev, info.st_ino))
    except OSError as error:
        error.filename = path  # fsync names no file: the stop line must say which
        raise
    finally:
        os.close(fd)


def is_temporary(path: Path) -> bool:
    return path.name.startswith(TEMPORARY_PREFIX)
