"""A disk that forgets: what a machine's death takes with it (issue 29).

The real filesystem under the simulation's directory is what every process sees, the page
cache. This module keeps what of it is not yet durable, and when the power fails (the one
machine, or every machine at once) puts it back as it was, the way FoundationDB's non-durable
file does, with POSIX's promise alone:

- a file's bytes are durable as of its inode's last fsync; a file created since has none (the
  name and no bytes: what XFS shows after a crash);
- a directory entry created, replaced or removed (create, rename, link, symlink, mkdir,
  unlink, rmdir) is durable once its directory is fsynced.

A rank killed alone loses nothing: what it wrote is in the kernel, which outlives it. Nor does
one machine of several, with OUT on a shared filesystem: what another machine saw of its
writes had reached the server, and the simulation cannot tell what no one saw (one real
filesystem shows every rank every byte at once), so it takes nothing it cannot prove unseen.

Every way the code reaches the filesystem goes through here: os's calls and `open` in every
writing mode are intercepted while a rank has the turn (the simulation's own set-up and its
checker write and read at once, durably).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import itertools
import os
import shutil
import stat
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GRAVEYARD = "forgotten"  # beside OUT: hard links to what non-durable changes replaced
DIRECTORY = "<directory>"  # what an rmdir removed: an empty directory, made again
_WRITING_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITING_MODES = frozenset("wax+")
_INTERCEPTED = ("open", "replace", "rename", "link", "symlink", "unlink", "remove", "mkdir",
                "rmdir", "truncate", "fsync", "fdatasync", "sync")

Inode = tuple[int, int]


@dataclass
class Change:
    """A directory entry changed, not durable until its directory is fsynced."""

    sequence: int
    directory: str
    name: str
    before: str | None  # a graveyard link to what the name held, DIRECTORY, or None: nothing
    after: Inode | None  # what the name holds since, None: nothing
    moved_from: str | None = None  # a directory renamed here: undone by renaming it back


class ForgettingDisk:
    def __init__(self, root: Path, in_turn: Callable[[], bool]):
        """`root`: the directory whose files are simulated; `in_turn`: whether a rank has
        the turn (else the simulation itself reads or writes)."""
        self.root = os.path.realpath(root)
        self.graveyard = os.path.join(self.root, GRAVEYARD)
        os.mkdir(self.graveyard)
        self.in_turn = in_turn
        self.changes: dict[str, list[Change]] = defaultdict(list)  # by directory
        self.durable: dict[Inode, bytes] = {}  # a file's bytes as of its last fsync
        self.forgotten: Counter[str] = Counter()  # what deaths took, in all
        self._sequence = itertools.count()
        self._buried = itertools.count()
        self._forgetting = False  # putting things back: not a change of anyone's
        # Called before a rank's fsync: where a machine's death planned for its next
        # fsyncs strikes (the moments at which what is durable changes).
        self.before_sync: Callable[[], None] = lambda: None
        self._os = {name: getattr(os, name) for name in _INTERCEPTED}
        self._io_open = io.open

    @contextlib.contextmanager
    def installed(self):
        """os's calls and `open` go through this disk within the block."""
        saved_builtin = builtins.open
        for name in _INTERCEPTED:
            setattr(os, name, getattr(self, f"_{name}"))
        io.open = builtins.open = self._open_file
        try:
            yield self
        finally:
            for name, function in self._os.items():
                setattr(os, name, function)
            io.open = self._io_open
            builtins.open = saved_builtin

    # -- deaths ------------------------------------------------------------------------

    def power_failure(self) -> None:
        """Every machine dies at once: what no fsync made durable is as it was."""
        with self._putting_back():
            undone = sorted((c for changes in self.changes.values() for c in changes),
                            key=lambda c: c.sequence, reverse=True)
            for change in undone:
                self._undo(change)
                self._drop(change)
            self.changes.clear()
            files = 0
            for path, key in self._files():
                if self._read(path) != self.durable[key]:
                    self._rewrite(path, self.durable[key])
                    files += 1
        self.forgotten["directory entries"] += len(undone)
        self.forgotten["files' bytes"] += files

    @contextlib.contextmanager
    def _putting_back(self):
        self._forgetting = True
        try:
            yield
        finally:
            self._forgetting = False

    def _files(self):
        """(path, inode) of every regular file under the root this disk knows the bytes of,
        one name per inode."""
        seen: set[Inode] = set()
        for directory, _, names in os.walk(self.root):
            if directory == self.graveyard:
                continue
            for name in names:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                key = (info.st_dev, info.st_ino)
                if key in self.durable and key not in seen and stat.S_ISREG(info.st_mode):
                    seen.add(key)
                    yield path, key

    def _undo(self, change: Change) -> None:
        path = os.path.join(change.directory, change.name)
        now = _inode(path)
        if now != change.after:
            return  # the name changed since, durably or by another machine: that stands
        if change.moved_from is not None:
            self._os["rename"](path, change.moved_from)
            return
        if now is not None:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)  # with everything made in it: unreachable after the crash
            else:
                self._os["unlink"](path)
        if change.before == DIRECTORY:
            self._os["mkdir"](path)
        elif change.before is not None:
            self._os["link"](change.before, path, follow_symlinks=False)

    def _drop(self, change: Change) -> None:
        if change.before not in (None, DIRECTORY):
            self._os["unlink"](change.before)

    # -- what makes things durable -------------------------------------------------------

    def _fsync(self, fd: int) -> None:
        self.before_sync()
        self._os["fsync"](fd)
        self._synced(fd)

    def _fdatasync(self, fd: int) -> None:
        self.before_sync()
        self._os["fdatasync"](fd)
        self._synced(fd)

    def _sync(self) -> None:
        """sync(2): everything is durable."""
        self.before_sync()
        self._os["sync"]()
        for changes in self.changes.values():
            for change in changes:
                self._drop(change)
        self.changes.clear()
        for path, key in self._files():
            self.durable[key] = self._read(path)

    def _synced(self, fd: int) -> None:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            directory = os.readlink(f"/proc/self/fd/{fd}")
            for change in self.changes.pop(directory, ()):
                self._drop(change)
            return
        key = (info.st_dev, info.st_ino)
        if key in self.durable:  # read anew: the descriptor may be write-only
            self.durable[key] = self._read(f"/proc/self/fd/{fd}")

    # -- what changes a file's bytes -----------------------------------------------------

    def _open(self, path, flags, mode=0o777, *, dir_fd=None):
        where = self._tracked(path, dir_fd) if flags & _WRITING_FLAGS else None
        if where is None:
            return self._os["open"](path, flags, mode, dir_fd=dir_fd)
        before = self._before_writing(where, truncating=bool(flags & os.O_TRUNC))
        fd = self._os["open"](path, flags, mode, dir_fd=dir_fd)
        self._opened_to_write(where, os.fstat(fd), before)
        return fd

    def _open_file(self, file, mode="r", *args, **kwargs):
        where = None
        if not isinstance(file, int) and _WRITING_MODES & set(mode):
            where = self._tracked(file)
        if where is None:
            return self._io_open(file, mode, *args, **kwargs)
        before = self._before_writing(where, truncating="w" in mode)
        opened = self._io_open(file, mode, *args, **kwargs)
        self._opened_to_write(where, os.fstat(opened.fileno()), before)
        return opened

    def _truncate(self, path, length):
        where = self._tracked(path) if not isinstance(path, int) else None
        if where is None:
            return self._os["truncate"](path, length)
        before = self._before_writing(where, truncating=True)
        self._os["truncate"](path, length)
        self._opened_to_write(where, os.stat(where), before)
        return None

    def _before_writing(self, path: str, *, truncating: bool):
        """What a write-open of `path` finds: its inode then, and its bytes if they are
        about to go and were durable."""
        try:
            info = os.stat(path)
        except OSError:
            return None
        key = (info.st_dev, info.st_ino)
        if key in self.durable or not stat.S_ISREG(info.st_mode) or not truncating:
            return key, None
        return key, self._read(path)

    def _opened_to_write(self, path: str, info: os.stat_result, before) -> None:
        key = (info.st_dev, info.st_ino)
        if before is None:  # it made the file
            self._changed(path, None, key)
            self.durable[key] = b""
        elif key not in self.durable and stat.S_ISREG(info.st_mode):  # durable until now
            self.durable[key] = (before[1] if before[0] == key and before[1] is not None
                                  else self._read(path))

    # -- what changes a directory --------------------------------------------------------

    def _replace(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        self._move("replace", src, dst, src_dir_fd, dst_dir_fd)

    def _rename(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        self._move("rename", src, dst, src_dir_fd, dst_dir_fd)

    def _move(self, call, src, dst, src_dir_fd, dst_dir_fd) -> None:
        source, target = self._tracked(src, src_dir_fd), self._tracked(dst, dst_dir_fd)
        if source is None or target is None:
            self._os[call](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return
        moving = _inode(source)
        if os.path.isdir(source) and not os.path.islink(source):
            self._os[call](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            self._changed(target, None, moving, moved_from=source)
            return
        replaced = self._bury(target)
        moved = self._bury(source)
        try:
            self._os[call](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        except BaseException:
            for buried in (replaced, moved):
                if buried not in (None, DIRECTORY):
                    self._os["unlink"](buried)
            raise
        self._changed(source, moved, None)
        self._changed(target, replaced, moving)

    def _link(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
        self._os["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd,
                         follow_symlinks=follow_symlinks)
        target = self._tracked(dst, dst_dir_fd)
        if target is not None:
            self._changed(target, None, _inode(target))

    def _symlink(self, src, dst, target_is_directory=False, *, dir_fd=None):
        self._os["symlink"](src, dst, target_is_directory, dir_fd=dir_fd)
        target = self._tracked(dst, dir_fd)
        if target is not None:
            self._changed(target, None, _inode(target))

    def _mkdir(self, path, mode=0o777, *, dir_fd=None):
        self._os["mkdir"](path, mode, dir_fd=dir_fd)
        target = self._tracked(path, dir_fd)
        if target is not None:
            self._changed(target, None, _inode(target))

    def _unlink(self, path, *, dir_fd=None):
        target = self._tracked(path, dir_fd)
        if target is None:
            return self._os["unlink"](path, dir_fd=dir_fd)
        buried = self._bury(target)
        try:
            self._os["unlink"](path, dir_fd=dir_fd)
        except BaseException:
            if buried not in (None, DIRECTORY):
                self._os["unlink"](buried)
            raise
        self._changed(target, buried, None)
        return None

    _remove = _unlink

    def _rmdir(self, path, *, dir_fd=None):
        self._os["rmdir"](path, dir_fd=dir_fd)
        target = self._tracked(path, dir_fd)
        if target is not None:
            self._changed(target, DIRECTORY, None)

    def _changed(self, path: str, before, after, *, moved_from=None) -> None:
        directory, name = os.path.split(path)
        self.changes[directory].append(Change(next(self._sequence), directory, name, before,
                                              after, moved_from))

    def _bury(self, path: str) -> str | None:
        """A graveyard link to what `path` names (DIRECTORY for a directory), so that the
        name can be given it back; None if it names nothing."""
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(info.st_mode):
            return DIRECTORY
        grave = os.path.join(self.graveyard, str(next(self._buried)))
        self._os["link"](path, grave, follow_symlinks=False)
        return grave

    # -- helpers -------------------------------------------------------------------------

    def _tracked(self, path, dir_fd=None) -> str | None:
        """The absolute path `path` names, if a rank is writing under the root (and not in
        the graveyard); else None."""
        if self._forgetting or not self.in_turn():
            return None
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        path = os.path.abspath(path)
        if not path.startswith(self.root + os.sep) or path.startswith(self.graveyard):
            return None
        return path

    def _read(self, path: str) -> bytes:
        with self._io_open(path, "rb") as file:
            return file.read()

    def _rewrite(self, path: str, data: bytes) -> None:
        fd = self._os["open"](path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _inode(path: str) -> Inode | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino
