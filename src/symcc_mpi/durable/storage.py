"""When the campaign's filesystem refuses writes (full, over quota, read-only): recognising
it and saying so in one line.

Such a failure is nobody's input's fault: the campaign stops with everything committed so
far intact, and `--resume` continues once there is room again. Requeueing or deferring
inputs for it would only turn a full disk into a stampede (issue 9).
"""

from __future__ import annotations

import errno
import os

# ENOSPC: no space left; EDQUOT: over quota; EROFS: mounted (or remounted) read-only.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})

STOP_ADVICE = "stopping; free space and continue with --resume"
# The exit status of a campaign stopped so: sysexits' EX_TEMPFAIL ("try again later").
STORAGE_EXIT = 75


def storage_refused(error: BaseException) -> bool:
    """Whether `error` says the filesystem refused the write, not what was being written
    (or, `storage_refused` set, that a journal can take no more writes)."""
    return isinstance(error, OSError) and (error.errno in _STORAGE_ERRNOS
                                           or getattr(error, "storage_refused", False))


def storage_failing(error: BaseException) -> bool:
    """Whether `error` says the filesystem refused the write or failed it (EIO: the device):
    where no commit retries the input, the campaign stops for either."""
    return storage_refused(error) or (isinstance(error, OSError) and error.errno == errno.EIO)


def describe(error: OSError, fallback: str | os.PathLike) -> str:
    """"no space left on device writing PATH": the path written (for a rename or a copy, its
    destination), else `fallback` when the error names none (a buffered flush)."""
    path = error.filename2 or error.filename or fallback
    return f"{os.strerror(error.errno).lower()} writing {os.fsdecode(path)}"
