"""Node-local scratch (--scratch DIR): where a rank's temporary files go, checked on its node.

A worker keeps its executor's files, QSYM's map, its object cache and its coverage probes in
a directory of its own under DIR, and only stages results in OUT, the shared directory. DIR
is node-local: it may exist on one node and not on another, so each rank checks it where it
runs: a worker that cannot use it tells the master in a Fatal; the master (and symcc-mpi's own
launcher, before mpiexec) refuses to start. It is not part of a campaign's identity (not in
the marker's config): a resumed run may name another.

A worker removes its directory when it ends. One that is killed (SIGKILL, the OOM killer)
cannot: its directory, in tmpfs by default, would hold memory until the node reboots. So the
maker of a directory holds a flock on the `.owner` file in it for as long as it lives, and
whoever makes a scratch directory on the node (the next worker), and the launcher when its
job ends, removes the directories whose owner file nobody holds any more. `.owner` appears
already locked (it is locked under another name, then renamed), so a directory being made
is never taken for a dead one; one without it is left alone.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from symcc_mpi.config import UsageError, temporary_directory_set

_WHY = {
    errno.ENOENT: "no such directory",
    errno.ENOTDIR: "not a directory",
    errno.EACCES: "not writable (permission denied)",
    errno.EPERM: "not writable (operation not permitted)",
    errno.EROFS: "not writable (read-only file system)",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
}


def default_root() -> Path:
    """This node's temporary directory: $TMPDIR (or TEMP, TMP) when set, which schedulers
    point at a per-job local disk, else /dev/shm when it is there to write, else /tmp. A run
    creates a file per input it generates and per child it probes: on tmpfs that costs a
    tenth of what it costs on these VMs' ext4 (8 µs against 100 µs, measured)."""
    if not temporary_directory_set():
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
            return shm
    return Path(tempfile.gettempdir())


OWNED_PREFIX = "symcc-mpi-"  # the directories sweep_scratch may judge
OWNER_FILE = ".owner"

_owned: dict[Path, int] = {}  # directory made by this process -> its locked owner file


def make_scratch(root: Path | None, prefix: str) -> Path:
    """A new private directory under `root` (None: `default_root`), owned by this process
    until `remove_scratch`; the dead's directories there are removed first. Raises
    UsageError, one line naming the directory, when it cannot."""
    where = _root(root)
    sweep_scratch(where)
    made = None
    try:
        made = Path(tempfile.mkdtemp(prefix=OWNED_PREFIX + prefix, dir=where))
        _own(made)
        return made
    except OSError as error:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        why = _WHY.get(error.errno, error.strerror or str(error))
        if error.errno == errno.ENOENT and where.is_dir():  # /proc, say
            why = f"not writable ({error.strerror})"
        default = "" if root is not None else " (the default, this node's temporary directory)"
        raise UsageError(f"--scratch {where}{default}: cannot make a scratch directory "
                         f"there: {why}") from None


def remove_scratch(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    fd = _owned.pop(directory, None)
    if fd is not None:
        os.close(fd)


def sweep_scratch(root: Path | None) -> int:
    """Remove the scratch directories under `root` whose owner is dead (its flock free);
    returns how many. Directories of the living, and any this cannot judge, are left."""
    removed = 0
    try:
        entries = list(os.scandir(_root(root)))
    except (OSError, UsageError):
        return 0  # make_scratch says why in its own words
    for entry in entries:
        if not entry.name.startswith(OWNED_PREFIX):
            continue
        try:
            fd = os.open(os.path.join(entry.path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # no owner file: being made, or not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner lives
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    return removed


def check_scratch(root: Path | None) -> None:
    """Refuse, on this node, a --scratch where no scratch directory can be made."""
    remove_scratch(make_scratch(root, "check-"))


def _root(root: Path | None) -> Path:
    try:
        return Path(root) if root is not None else default_root()
    except FileNotFoundError as error:  # gettempdir: no usable temporary directory at all
        raise UsageError(f"--scratch not given and {error}") from None


def _own(directory: Path) -> None:
    """Lock the owner file under a name no sweep opens, then give it its name: it is never
    seen unlocked while this process lives. Not inherited by the processes it starts."""
    pending = directory / (OWNER_FILE + ".new")
    fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(pending, directory / OWNER_FILE)
    except BaseException:
        os.close(fd)
        raise
    _owned[directory] = fd
