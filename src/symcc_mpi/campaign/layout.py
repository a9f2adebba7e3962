"""The campaign directory's names: where each thing lives in OUT, and whether OUT may be used.

Layout (DESIGN §4):
    OUT/.symcc-mpi          marker: this directory holds a symcc-mpi campaign
    OUT/corpus/<sha256>     every input the campaign keeps, named by the SHA-256 of its bytes
    OUT/.staging/<token>    one pack of children per dispatch (wire/staging.py), written by the
                            worker, verified child by child and promoted only by the master
    OUT/queue/ crashes/ hangs/   AFL-style names (id:NNNNNN,...), hard links where possible
    OUT/quarantine/         what was set aside (misnamed inputs, damaged journal lines) and
                            REASONS, one line for each
    OUT/state/done.jsonl    one checksummed line per analysed input: the resume point, and
                            under ULFM the work records of F443's WAL (wal.py, done_log.py)
    OUT/state/master.lock   the campaign lock: one master per state directory
    OUT/state/generations.jsonl  the communicator generations and recoveries (ulfm/)
    OUT/state/master-<k>/   master k's own state, for k >= 1 (--masters)
    OUT/.stop-request       a stop asked of a running campaign (stop.py)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..durable.atomic import TEMPORARY_PREFIX, make_directories

MARKER = ".symcc-mpi"
# 2: the journals name an input's SHA-256 `digest`; 1 named it `sha256` (wal.check reads both,
# so a campaign of layout 1 resumes and verifies, and is layout 2 once resumed).
LAYOUT_VERSION = 2
DONE_JOURNAL = "done.jsonl"
MASTER_LOCK = "master.lock"
LEASE_DIRECTORY_PREFIX = ".standalone-work-"  # + the job epoch: a several-master job's leases
MASTER_STATE = "master-{}"  # under state/: master k's own state, for k >= 1 (--masters)
FINDINGS = "findings"  # in a master's state: crashes and hangs it handed to the first master


class CampaignError(Exception):
    """The campaign directory cannot be used as asked: one line, exit status 2."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def layout_of(out: Path) -> int:
    """The layout version of the campaign in `out`; CampaignError if this version cannot read
    it (a newer symcc-mpi wrote it) or the marker is damaged."""
    marker = out / MARKER
    try:
        layout = json.loads(marker.read_bytes())["layout"]
    except OSError as error:
        raise CampaignError(f"cannot read {marker}: {error.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise CampaignError(f"{marker} is damaged: it names no layout version") from None
    if not isinstance(layout, int) or not 1 <= layout <= LAYOUT_VERSION:
        raise CampaignError(f"{out} holds a campaign of layout {layout!r}, which this symcc-mpi "
                            f"cannot read (layouts 1 to {LAYOUT_VERSION}): use the version "
                            "that wrote it")
    return layout


def check_out_dir(out: Path, *, resume: bool) -> None:
    """Refuse an output directory we must not write into, before anything is launched."""
    if out.exists() and not out.is_dir():
        raise CampaignError(f"output path {out} exists and is not a directory")
    if resume:
        if not (out / MARKER).is_file():
            raise CampaignError(f"--resume: {out} holds no symcc-mpi campaign to resume")
        layout_of(out)
        _probe_writable(out)
        return
    if out.exists():
        if (out / MARKER).exists():
            raise CampaignError(
                f"output directory {out} already holds a campaign: "
                "pass --resume to continue it, or choose another directory"
            )
        if any(out.iterdir()):
            raise CampaignError(
                f"output directory {out} is not empty and holds no symcc-mpi campaign"
            )
    try:
        make_directories(out)
    except OSError as error:
        raise CampaignError(f"output directory {out} is not writable: {error.strerror}") from None
    _probe_writable(out)


def _probe_writable(out: Path) -> None:
    try:
        probe = out / f"{TEMPORARY_PREFIX}write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise CampaignError(f"output directory {out} is not writable: {error.strerror}") from None


def master_state(out: Path, master: int) -> Path:
    """Where master `master` keeps its journal, lock and checkpoints: state/ itself for the
    first (a one-master campaign's layout), state/master-k/ for the others."""
    state = out / "state"
    return state if master == 0 else state / MASTER_STATE.format(master)


def done_journals(out: Path) -> list[Path]:
    """Every master's done journal that exists, the first master's first: together they are
    the campaign's "analysed" set, whatever number of masters wrote them."""
    state = out / "state"
    prefix = MASTER_STATE.format("")
    try:
        names = os.listdir(state)
    except OSError:
        return []
    # Read by every check of the others' journals: listdir and stat, not glob's pathlib.
    numbered = sorted((int(name[len(prefix):]), name) for name in names
                      if name.startswith(prefix) and name[len(prefix):].isdigit())
    journals = [state / DONE_JOURNAL] + [state / name / DONE_JOURNAL for _, name in numbered]
    return [path for path in journals if os.path.exists(path)]
