"""Regular files only: listing and opening what a target or a worker wrote, never a link.

A target writes into its output directory whatever it likes, and a staging directory is
written by a worker: a symlink there (to /etc/passwd, to another campaign's file), a FIFO
(whose open would wait for a writer forever), a device or a socket is not a test case. Every
reader of those directories goes through this module: listings decide by `lstat` (the
directory entry's own type, links not followed), and opens use O_NOFOLLOW | O_NONBLOCK and
check `fstat` on the descriptor they then read, so an entry swapped between the listing and
the open is refused too.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# O_NOFOLLOW: a symlink as the last component fails with ELOOP instead of opening its target.
# O_NONBLOCK: a FIFO opens at once (instead of waiting for a writer) and is then refused by
# the fstat; on a regular file it changes nothing.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotRegularFile(OSError):
    """An entry that is not a regular file (symlink, FIFO, device, socket, directory)."""

    def __init__(self, kind: str):
        super().__init__(errno.EINVAL, f"a {kind}, not a regular file")
        self.kind = kind


def kind_of(mode: int) -> str:
    """What an `lstat` mode names, in words for a log line."""
    for test, kind in ((stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISREG, "regular file")):
        if test(mode):
            return kind
    return "special file"


def open_regular(name: str | Path, *, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """A read descriptor on `name` and its fstat, if it is a regular file.

    Raises NotRegularFile for anything else (a symlink, whose ELOOP is translated, a FIFO, a
    device, a directory; a socket, which cannot be opened), OSError if it cannot be opened.
    """
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise NotRegularFile("symlink") from None
        if error.errno == errno.ENXIO:  # what open(2) says of a socket
            raise NotRegularFile("socket") from None
        raise
    try:
        status = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise NotRegularFile(kind_of(status.st_mode))
    return fd, status


@dataclass(frozen=True)
class Listing:
    """The regular files of a directory, and how many entries of each other kind it held."""

    files: tuple[Path, ...]
    skipped: Counter[str] = field(default_factory=Counter)


def list_regular(directory: Path, *, skip_hidden: bool = False) -> Listing:
    """The regular files in `directory`, sorted, decided by each entry's own type (lstat):
    links, FIFOs, devices, sockets and directories are counted in `skipped`, never followed.
    `skip_hidden`: dot-files are left out uncounted (SymCC's test cases still being written).
    A directory that cannot be read lists nothing."""
    files, skipped = [], Counter()
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if skip_hidden and entry.name.startswith("."):
                    continue
                if entry.is_file(follow_symlinks=False):
                    files.append(Path(entry.path))
                else:
                    try:
                        skipped[kind_of(entry.stat(follow_symlinks=False).st_mode)] += 1
                    except OSError:
                        skipped["vanished entry"] += 1
    except OSError:
        return Listing(())
    return Listing(tuple(sorted(files)), skipped)
