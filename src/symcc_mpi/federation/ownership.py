"""Which master owns an input, and where one job's shared lease table lives (F320 §2.1–2.2).

Rendezvous (highest-random-weight) hashing, Thaler and Ravishankar 1998: every master computes
the same owner from the digest and the list of master ranks alone, with no routing table, and
adding a master moves only the digests the newcomer wins; removing one moves only its own. The
owner is only the *preferred* master: admission also needs the shared claim
(federation/leases.py), so a race or a stale view costs a refused claim, never a double analysis.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

from symcc_mpi.campaign.layout import LEASE_DIRECTORY_PREFIX

OWNER_DOMAIN = b"symcc-work-owner-v1"
EPOCH_BYTES = 32
OWNER_CACHE = 1 << 16  # digests whose owner a master remembers

_DIGEST = re.compile(r"[0-9a-f]{64}")


def _score(digest: str, master: int) -> int:
    """The first 128 bits, big-endian, of SHA-256(domain || digest bytes || rank as u32 BE)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"a digest is a lowercase hex SHA-256 (got {digest!r})")
    if isinstance(master, bool) or not isinstance(master, int) or not 0 <= master < 2**32:
        raise ValueError(f"a master rank is an integer in 0..2**32-1 (got {master!r})")
    mixed = hashlib.sha256(OWNER_DOMAIN + bytes.fromhex(digest) + master.to_bytes(4, "big"))
    return int.from_bytes(mixed.digest()[:16], "big")


def owner(digest: str, masters: Sequence[int]) -> int:
    """The master of `masters` with the highest score for `digest`; a tie goes to the lower rank."""
    if not masters:
        raise ValueError("owner() needs at least one master")
    return max(masters, key=lambda master: (_score(digest, master), -master))


def owner_among(masters: tuple[int, ...]) -> Callable[[str], int]:
    """`owner` over `masters`, remembered: a master asks it several times per task
    (admission, claims ahead, the lease table's shard)."""
    return functools.lru_cache(maxsize=OWNER_CACHE)(functools.partial(owner, masters=masters))


def new_epoch() -> bytes:
    """A job epoch (F320 §2.2): 256 random bits drawn by world rank 0 and broadcast."""
    return secrets.token_bytes(EPOCH_BYTES)


def lease_directory(out: Path, epoch: bytes) -> Path:
    """`OUT/.standalone-work-<epoch hex>/`: the job's lease table and publication logs."""
    if not isinstance(epoch, bytes) or len(epoch) != EPOCH_BYTES:
        raise ValueError(f"an epoch is {EPOCH_BYTES} bytes (got {epoch!r})")
    return Path(out) / f"{LEASE_DIRECTORY_PREFIX}{epoch.hex()}"


def owner_name(epoch: bytes, master: int) -> str:
    """Master `master`'s name in the job's lease table: one index of one job epoch, which
    its successors take on."""
    return f"{epoch.hex()[:16]}-master-{master}"
