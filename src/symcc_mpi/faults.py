"""Fault injection by configuration, for the real-mpiexec tests.

`SYMCC_MPI_FAULTS` is a comma-separated list of `RANK:KIND@N` (or `RANK:KIND@N=SECONDS` for
`stop`). N counts dispatches as the faulty side sees them, from 1. Worker kinds:

- `foreign-result`: before the real RESULT of its N-th dispatch, send a RESULT with a token
  it was never given, carrying a real staged file;
- `stale-result`: before the real RESULT of its N-th dispatch, send one with the token of its
  previous dispatch (already answered), carrying a new staged file;
- `malformed-result`: send garbage instead of the RESULT of its N-th dispatch (its next READY
  then echoes the token);
- `stop`: after running its N-th dispatch, stop itself (SIGSTOP) until SECONDS (default 5)
  after that dispatch's WORK arrived, then send its RESULT as if nothing happened. The hold
  is counted from the arrival, not from the end of the execution, so a test knows when the
  RESULT comes however slowly the execution ran (a busy machine); if the execution alone
  took longer, there is no stop. A worker killed while stopped leaves no helper behind.

Master kinds (rank 0), counting WORK sends:

- `send-fail`: the N-th WORK send raises instead of sending;
- `send-ambiguous`: the N-th WORK send delivers, then raises (F313 §4: the master cannot
  tell, undoes the dispatch as unsent, and the worker's RESULT must then be refused);
- `object-send-fail`: the N-th WORK that carries object content raises instead of sending.
"""

from __future__ import annotations

import os

WORKER_KINDS = ("foreign-result", "stale-result", "malformed-result", "stop")
MASTER_KINDS = ("send-fail", "send-ambiguous", "object-send-fail")
DEFAULT_STOP_SECONDS = 5.0


class Faults:
    def __init__(self, rank: int, spec: str | None = None):
        spec = os.environ.get("SYMCC_MPI_FAULTS", "") if spec is None else spec
        self.planned: dict[tuple[str, int], float | None] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            target, _, rest = item.partition(":")
            kind, _, when = rest.partition("@")
            number, _, argument = when.partition("=")
            kinds = MASTER_KINDS if target == "0" else WORKER_KINDS
            if kind not in kinds or not target.isdigit() or not number.isdigit() \
                    or (argument and (kind != "stop" or not _is_seconds(argument))):
                raise ValueError(f"SYMCC_MPI_FAULTS: cannot parse {item!r}")
            if int(target) == rank:
                self.planned[(kind, int(number))] = float(argument) if argument else None

    def fire(self, kind: str, number: int) -> bool:
        return (kind, number) in self.planned

    def stop_seconds(self, number: int) -> float:
        return self.planned.get(("stop", number)) or DEFAULT_STOP_SECONDS


def _is_seconds(text: str) -> bool:
    try:
        return 0 < float(text) < 3600
    except ValueError:
        return False
