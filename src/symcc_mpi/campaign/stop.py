"""Stop requests: `OUT/.stop-request`, written by `symcc-mpi stop` or the launcher, taken by
the master of the run it names."""

from __future__ import annotations

import enum
from pathlib import Path

from symcc_mpi.durable.atomic import write_durable

STOP_REQUEST = ".stop-request"


class StopRequest(enum.Enum):
    NONE = "none"
    THIS_RUN = "this-run"
    STALE = "stale"  # left by a run that is gone: never stops the next one


def stop_request_verdict(text: str, made: float, run_id: str, run_started: float) -> StopRequest:
    """Whom a stop request is for. The launcher writes the run id it gave the job; a user
    under their own launcher may `touch` an empty one (README), which counts only if it was
    made after this run started. Anything else was left by an earlier run."""
    named = text.strip()
    if named == run_id or (not named and made >= run_started):
        return StopRequest.THIS_RUN
    return StopRequest.STALE


def request_stop(out: Path, run_id: str) -> None:
    """Ask the master of run `run_id` to stop; the request names the run it is for. Written
    whole (a master polling it never reads half a run id, so never takes it as stale)."""
    write_durable(out / STOP_REQUEST, f"{run_id}\n".encode())


def read_stop_request(out: Path, run_id: str, run_started: float) -> StopRequest:
    """Whether a stop was asked of run `run_id`, which started at `run_started` (wall clock).
    A request left by another run is removed at once; one for this run stays until the run
    ends (`withdraw_stop_request`): a master that takes the campaign over from one that died
    while stopping reads it again, and stops too."""
    path = out / STOP_REQUEST
    try:
        text = path.read_text(errors="replace")
        made = path.stat().st_mtime
    except FileNotFoundError:
        return StopRequest.NONE
    verdict = stop_request_verdict(text, made, run_id, run_started)
    if verdict is StopRequest.STALE:
        path.unlink(missing_ok=True)
    return verdict


def withdraw_stop_request(out: Path) -> None:
    """The run that a stop request was for has ended: the request is done with."""
    (out / STOP_REQUEST).unlink(missing_ok=True)
