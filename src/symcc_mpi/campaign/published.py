"""The names a lone master publishes after its last snapshot (snapshot.py), each written here
just before its file appears: a resume after a crash learns what the snapshot does not know
from these few lines instead of listing corpus/ and queue/ (21 s at a million inputs, cold).

`state/published-<serial>.log` belongs to the snapshot of that serial; a line per corpus
file, queue/ entry, crash or hang, `["queue", digest, name]`, written before the link or
rename that publishes it. The log is not synced: a resume trusts it only on the boot that
wrote it (snapshot.py), where the page cache it lives in is the one the files live in too,
so every file published since the snapshot has its line. A line whose file is not there
announced a publication that never happened (its master died in between, or its write
failed): nothing to do.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from symcc_mpi.campaign.afl_names import parse_afl_queue_id
from symcc_mpi.wire.protocol import SHA256_PATTERN

LOG_FILE = "published-{serial}.log"
KINDS = ("corpus", "queue", "crashes", "hangs")


class PublishLog:
    """The log of the snapshot in force; silent until one is (`start`)."""

    def __init__(self, state: Path):
        self.state = state
        self._fd: int | None = None
        self._path: Path | None = None  # the log `_fd` appends to
        self._encoder = msgspec.json.Encoder()

    def start(self, serial: int) -> None:
        """The snapshot of `serial` is durable: log what is published from now on for it,
        and drop the logs of earlier snapshots."""
        self.close()
        path = self._path = self.state / LOG_FILE.format(serial=serial)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        for stale in self.state.glob(LOG_FILE.format(serial="*")):
            if stale != path:
                stale.unlink(missing_ok=True)

    def intend(self, kind: str, digest: str, name: str = "") -> None:
        if self._fd is not None:
            try:
                os.write(self._fd, self._encoder.encode((kind, digest, name)) + b"\n")
            except OSError as error:
                if error.filename is None:  # os.write names no file: say which (one line)
                    error.filename = str(self._path)
                raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Published:
    """What a publish log's lines say appeared: the inputs (corpus/ files) in order, and each
    kind's AFL-named entries as (id, digest, name) in id order."""

    inputs: list[str]
    entries: dict[str, list[tuple[int, str, str]]]


def replay(lines: list[tuple[str, str, str]],
           exists: Callable[[str, str, str], bool]) -> Published:
    """What of `lines` was published, asking `exists(kind, digest, name)` as little as it
    can (a look in a directory of a million entries, cold, costs ~30 µs).

    AFL ids are dense and each is taken only once its entry exists (queues.py): an id
    announced again was not published the first time, and an announced id below the
    highest was published by its last announcement; only the highest needs a look. A
    corpus/ file exists if a queue/ entry links to it; only the others are looked at (the
    input published by a master that died before queueing it)."""
    announced: dict[str, dict[int, tuple[str, str]]] = {kind: {} for kind in KINDS[1:]}
    inputs: list[str] = []
    for kind, digest, name in lines:
        if kind == "corpus":
            inputs.append(digest)
        else:
            announced[kind][parse_afl_queue_id(name)] = (digest, name)
    entries = {}
    for kind, by_id in announced.items():
        top = max(by_id, default=None)
        entries[kind] = [(entry_id, *by_id[entry_id]) for entry_id in sorted(by_id)
                         if entry_id != top or exists(kind, *by_id[entry_id])]
    queued = {digest for _, digest, _ in entries["queue"]}
    return Published([digest for digest in dict.fromkeys(inputs)
                      if digest in queued or exists("corpus", digest, "")], entries)


def read(state: Path, serial: int) -> list[tuple[str, str, str]]:
    """The lines of the log of `serial`, oldest first; none if it was never written (nothing
    was published after its snapshot). A last line cut short was never acted on."""
    try:
        raw = (state / LOG_FILE.format(serial=serial)).read_bytes()
    except FileNotFoundError:
        return []
    lines = raw.split(b"\n")[:-1]  # what follows the last newline was being written
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            kind, digest, name = msgspec.json.decode(line, type=tuple[str, str, str])
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise ValueError(f"line {number}: {error}") from None
        if kind not in KINDS or not SHA256_PATTERN.match(digest) \
                or (kind != "corpus" and parse_afl_queue_id(name) is None):
            raise ValueError(f"line {number}: not a publication: {line[:80]!r}")
        entries.append((kind, digest, name))
    return entries
