"""The package's locks: `flock`s on a file (held for a life, or around one append) and bounded
lock-directory locks on a shared POSIX directory (a monotonic deadline, no age breaks).

Two `flock`s, two scopes: `FileLock` is the campaign lock (`OUT/state/master.lock`, held for
a master's whole life: one writer of done.jsonl; `wait` rides out an NFS server that frees a
dead client's lock only when its lease expires), and `flocked` is held around one
read-decide-append of the generation log, which several survivors of a failure write in turn.

Lock directories, why they look the way they do (F320 §2.6, F321, F311 §4 step 2):

* The lock is a directory, because `mkdir`/`rename` of a directory is atomic on every POSIX
  filesystem a campaign shares (NFS included), where `flock` alone may be local to one host.
* Waiting is bounded by a deadline on the waiter's own *monotonic* clock
  (`SYMCC_STANDALONE_WORK_LOCK_ACQUIRE_TIMEOUT`). When it passes, `LockTimeout` (a
  `TimeoutError`) is raised and the caller fails closed (F320: the master goes to Abort(70)).
* A lock is **never** removed because it looks old. F320 first broke locks older than a
  wall-clock TTL; F321 showed that a paused holder can wake up and overwrite the new holder's
  state, so the observed age is only *reported* (in `LockTimeout`).
* A lock whose holder is *provably dead* may be cleared, because otherwise one SIGKILL inside a
  lease write would wedge that record for ever. Proof of death, never age: the holder keeps an
  exclusive `flock` on its holder file for as long as it holds the lock; the kernel drops it
  when the process dies. A waiter running on the same kernel (same boot id) that obtains that
  flock knows the holder is gone. A holder from the same host name but an earlier boot is gone
  too (no process survives a reboot). A holder on another host is never cleared: its flock may
  be invisible from here.
* Acquisition publishes a complete lock in one step: the holder file is written and flocked in
  a private temporary directory that is then renamed onto the lock path (rename of a directory
  onto an existing non-empty directory fails). So no visible lock lacks its holder file, and a
  process killed at any point leaves either no lock or a lock whose death is provable.
  An empty lock directory is free (a rename replaces it), so release is: unlink the holder
  file (the instant the lock becomes free), then remove the directory unless it was taken.

Debris (`.tmp-lock-*`, `.tmp-released-*` directories of killed processes) carries the boot id
and pid in its name and is swept by `sweep_debris` once that process is known to be gone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock

BUSY = (errno.EWOULDBLOCK, errno.EACCES)  # what flock says of a lock another holds


class FlockHeld(OSError):
    """Another process holds the flock."""


class FileLock:
    """An exclusive flock on `path`, held until `release`; the holder's pid is written into
    the file (for a person looking). Not re-entrant."""

    def __init__(self, path: Path, *, clock: Clock = SYSTEM_CLOCK):
        self.path = Path(path)
        self.clock = clock
        self._handle = None

    def acquire(self, *, wait: float = 0.0) -> None:
        """Take the lock, waiting up to `wait` seconds for a holder to lose it; FlockHeld if
        it still holds it then."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        deadline = self.clock.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno in BUSY and self.clock.monotonic() < deadline:
                    self.clock.sleep(0.2)
                    continue
                handle.close()
                if error.errno in BUSY:
                    raise FlockHeld(error.errno, "held by another process", str(self.path)) \
                        from None
                raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Drop the lock; a no-op when not held."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def check_unlocked(path: Path) -> None:
    """FlockHeld if a process holds the flock on `path` now (taken and dropped at once;
    nothing is written). A file that does not exist was never locked."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in BUSY:
                raise FlockHeld(error.errno, "held by another process", str(path)) from None
            raise


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if need be) for the block, waiting for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the flock


# -- lock directories ----------------------------------------------------------------------

HOLDER_FILE = "holder"
_ACQUIRING = ".tmp-lock"
_RELEASED = ".tmp-released"
FIRST_NAP = 0.0005
LONGEST_NAP = 0.02


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT_ID = _boot_id()
HOSTNAME = socket.gethostname()


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock: written into the lock directory for diagnostics and death proofs."""

    pid: int
    host: str
    boot_id: str
    acquired: float  # wall-clock seconds, comparable across hosts: only ever reported
    label: str = ""
    flocked: bool = True  # False: the filesystem refused flock, so death is never provable

    @classmethod
    def decode(cls, data: bytes) -> LockHolder | None:
        try:
            raw = json.loads(data)
            return cls(
                pid=int(raw["pid"]),
                host=str(raw["host"]),
                boot_id=str(raw["boot_id"]),
                acquired=float(raw["acquired"]),
                label=str(raw.get("label", "")),
                flocked=bool(raw.get("flocked", False)),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def describe(self) -> str:
        who = f" ({self.label})" if self.label else ""
        return f"pid {self.pid}{who} on {self.host}"


class LockError(OSError):
    """A lock could not be used as a lock (not a timeout): lost, or its path is not a lock."""


class LockTimeout(TimeoutError):
    """The acquisition deadline passed while someone else held the lock (F320 §2.6).

    `age` is how long the holder has held it by the wall clock (None if unknown): reported so an
    operator can judge, never used to break the lock.
    """

    def __init__(self, path: Path, waited: float, age: float | None, holder: LockHolder | None):
        self.path = path
        self.waited = waited
        self.age = age
        self.holder = holder
        held = f"held {age:.1f} s" if age is not None else "held for an unknown time"
        by = f" by {holder.describe()}" if holder is not None else ""
        super().__init__(
            f"lock {path} {held}{by}; gave up after {waited:.3f} s; not broken: remove it by "
            f"hand only if that holder is certainly gone"
        )


def _age(path: Path, holder: LockHolder | None, clock: Clock) -> float | None:
    if holder is not None:
        return max(0.0, clock.time() - holder.acquired)
    try:
        return max(0.0, clock.time() - path.stat().st_mtime)
    except OSError:
        return None


def _read_holder(path: Path) -> LockHolder | None:
    try:
        return LockHolder.decode((path / HOLDER_FILE).read_bytes())
    except OSError:
        return None


def _provably_gone(holder: LockHolder) -> bool:
    """Given that its flock is free: is the holder certainly not running any more?"""
    if not holder.flocked:
        return False
    if BOOT_ID and holder.boot_id == BOOT_ID:
        return True  # same kernel: a free flock means the process is gone
    return holder.host == HOSTNAME and holder.boot_id != BOOT_ID  # this host rebooted since


def _remove_tree(directory: str | Path) -> None:
    for name in os.listdir(directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


def _sibling(path: str | Path, kind: str) -> str:
    head, tail = os.path.split(os.fspath(path))
    return os.path.join(head, f"{kind}-{_debris_tag()}-{tail}")


def break_if_dead(path: str | Path) -> bool:
    """Clear the lock at `path` if and only if its holder is provably dead, or it has none
    (an empty directory); True if cleared.

    Safe against racing breakers and new holders: the breaker holds the dead holder's flock
    (so no other breaker can act on the same lock) and checks, while holding it, that the lock
    at `path` is still the one whose holder file it locked.
    """
    holder_path = os.path.join(path, HOLDER_FILE)
    try:
        fd = os.open(holder_path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        # No holder: a free lock whose releaser was killed between emptying it and removing
        # it (`release`). rmdir takes it away only while it is still empty.
        with contextlib.suppress(OSError):
            os.rmdir(path)
            return True
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # alive (EWOULDBLOCK), or flock unsupported: unprovable either way
        holder = LockHolder.decode(os.pread(fd, 4096, 0))
        if holder is None or not _provably_gone(holder):
            return False
        mine = os.fstat(fd)
        try:
            current = os.stat(holder_path)
        except OSError:
            return False
        if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            return False  # someone else cleared it and a new holder took it meanwhile
        tomb = _sibling(path, _RELEASED)
        try:
            os.rename(path, tomb)
        except OSError:
            return False
        _remove_tree(tomb)
        return True
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=64)
def _holder_fields(pid: int, label: str, flocked: bool) -> str:
    fields = {"pid": pid, "host": HOSTNAME, "boot_id": BOOT_ID, "label": label,
              "flocked": flocked}
    return json.dumps(fields)[1:-1]


def _holder_bytes(label: str, flocked: bool, acquired: float) -> bytes:
    # LockHolder as JSON; the fixed fields are encoded once, not on every acquisition.
    return f'{{"acquired": {acquired!r}, {_holder_fields(os.getpid(), label, flocked)}}}'.encode()


def _debris_tag() -> str:
    return f"{BOOT_ID[:8] or 'noboot'}-{os.getpid()}-{secrets.token_hex(4)}"


def _debris_owner_gone(name: str) -> bool:
    parts = name.split("-", 5)  # '.tmp', 'lock'|'released', boot8, pid, nonce, lock name
    if len(parts) < 6 or not BOOT_ID or parts[2] != BOOT_ID[:8]:
        return False
    try:
        pid = int(parts[3])
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # this process: maybe another thread's acquisition in progress
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def sweep_debris(directory: Path) -> int:
    """Remove the acquisition/release leftovers of dead processes of this boot; return count."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        if not (name.startswith(_ACQUIRING + "-") or name.startswith(_RELEASED + "-")):
            continue
        if not _debris_owner_gone(name):
            continue
        try:
            _remove_tree(directory / name)
            removed += 1
        except OSError:
            pass
    return removed


class DirectoryLock:
    """A lock directory at `path`, held as a context manager; not re-entrant.

    `timeout` bounds the wait, measured on `clock.monotonic()`; `sleep` is how the waiter naps
    (tests pass `ManualClock.advance` so that time jumps instead of passing). After acquiring,
    `waited` is the seconds spent waiting and `cleared` how many dead holders were cleared.
    """

    def __init__(
        self,
        path: Path,
        *,
        timeout: float,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Callable[[float], object] = SYSTEM_CLOCK.sleep,
        label: str = "",
    ):
        if not timeout >= 0:
            raise ValueError(f"lock timeout must be a number >= 0 (got {timeout!r})")
        self._path = os.fspath(path)
        self._holder_path = os.path.join(self._path, HOLDER_FILE)
        self.timeout = timeout
        self.clock = clock
        self.sleep = sleep
        self.label = label
        self.waited = 0.0
        self.cleared = 0
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return Path(self._path)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            raise LockError(errno.EDEADLK, "lock already held by this object", str(self.path))
        start = self.clock.monotonic()
        deadline = start + self.timeout
        staged, fd = self._stage()
        nap = FIRST_NAP
        try:
            while True:
                try:
                    os.rename(staged, self._path)
                except OSError as error:
                    if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
                else:
                    self._fd = fd
                    self.waited = self.clock.monotonic() - start
                    return
                if break_if_dead(self._path):
                    self.cleared += 1
                    continue
                now = self.clock.monotonic()
                if now >= deadline:
                    holder = _read_holder(self.path)
                    raise LockTimeout(self.path, now - start, _age(self.path, holder, self.clock),
                                      holder)
                self.sleep(min(nap, deadline - now))
                nap = min(nap * 1.5, LONGEST_NAP)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                _remove_tree(staged)
            raise

    def _stage(self) -> tuple[str, int]:
        staged = _sibling(self._path, _ACQUIRING)
        os.mkdir(staged)
        fd = -1
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(os.path.join(staged, HOLDER_FILE), flags, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                flocked = True
            except OSError:
                flocked = False
            os.write(fd, _holder_bytes(self.label, flocked, self.clock.time()))
        except BaseException:
            if fd >= 0:
                os.close(fd)
            _remove_tree(staged)
            raise
        return staged, fd

    def release(self) -> None:
        """Free the lock; a no-op when not held (safe to call twice)."""
        fd = self._fd
        if fd is None:
            return
        self._fd = None
        try:
            mine = os.fstat(fd)
            try:
                current = os.stat(self._holder_path)
            except FileNotFoundError:
                current = None
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                raise LockError(errno.ENOLCK, "lock was taken from its live holder", str(self.path))
            # Emptying the directory frees the lock: an acquirer's rename may replace an empty
            # directory, and then our rmdir finds its holder file and leaves it alone.
            os.unlink(self._holder_path)
            try:
                os.rmdir(self._path)
            except OSError as error:
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
        finally:
            os.close(fd)

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"DirectoryLock({str(self.path)!r}, held={self.held})"
