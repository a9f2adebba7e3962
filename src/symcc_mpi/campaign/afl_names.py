"""AFL's file names: the `id:NNNNNN,src:...,op:...` names of queue/, crashes/ and hangs/."""

from __future__ import annotations

import re
from collections.abc import Sequence

# afl-fuzz finds its sync position with "id:%06u": ids past six digits break -S/-M imports.
AFL_SYNC_MAX_ID = 999_999

_NAME_UNSAFE = re.compile(r"[/,\x00-\x1f]")


def afl_queue_name(
    id: int,
    src_ids: Sequence[int] = (),
    op: str | None = "symcc",
    *,
    sig: int | None = None,
    orig: str | None = None,
    time_ms: int | None = None,
    execs: int | None = None,
    new_cov: bool = False,
    sync: str | None = None,
) -> str:
    """An AFL-style queue/crash file name, e.g. "id:000012,src:000003,op:symcc".

    afl-fuzz -M (and -S when no main node exists) imports a foreign queue/ by looking,
    after sorting the names, for the entry starting "id:%06u" with the next id it expects
    and taking every entry from there on, counting one id per entry. So a queue/ must
    hold only such names, ids dense from 000000 in creation order, each file published
    whole (renamed from a dot-name), nothing else that does not start with a dot.
    """
    if id < 0 or any(s < 0 for s in src_ids):
        raise ValueError("AFL queue ids are non-negative")
    parts = [f"id:{id:06d}"]
    if sync is not None:  # imported from another instance: afl-fuzz's own sync names
        parts.append("sync:" + _NAME_UNSAFE.sub("_", sync))
    if sig is not None:
        parts.append(f"sig:{sig:02d}")
    if src_ids:
        parts.append("src:" + "+".join(f"{s:06d}" for s in src_ids))
    if time_ms is not None:
        parts.append(f"time:{time_ms}")
    if execs is not None:
        parts.append(f"execs:{execs}")
    if orig is not None:
        parts.append("orig:" + _NAME_UNSAFE.sub("_", orig))
    elif op:
        parts.append("op:" + _NAME_UNSAFE.sub("_", op))
    if new_cov:
        parts.append("+cov")
    name = ",".join(parts)
    return name.encode()[:255].decode("utf-8", "ignore")  # NAME_MAX


_QUEUE_ID = re.compile(r"id:(\d+)")


def parse_afl_queue_id(name: str) -> int | None:
    """The id of an AFL queue entry name ("id:000012,..." -> 12), None if not one."""
    m = _QUEUE_ID.match(name)
    return int(m.group(1)) if m else None
