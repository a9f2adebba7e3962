"""Fault injection by configuration, for the real-mpiexec tests.

`SYMCC_MPI_FAULTS` is a comma-separated list of `RANK:KIND@N` (or `RANK:KIND@N=SECONDS` for
`stop`, `RANK:hostile@N=FIELD` for `hostile`). N counts dispatches as the faulty side sees
them, from 1. Worker kinds:

- `foreign-result`: before the real RESULT of its N-th dispatch, send a RESULT with a token
  it was never given, carrying a real staged file;
- `stale-result`: before the real RESULT of its N-th dispatch, send one with the token of its
  previous dispatch (already answered), carrying a new staged file;
- `malformed-result`: send garbage instead of the RESULT of its N-th dispatch (its next READY
  then echoes the token);
- `stop`: after running its N-th dispatch, stop itself (SIGSTOP) for SECONDS (default 5),
  then send its RESULT as if nothing happened;
- `hostile`: instead of the RESULT of its N-th dispatch, send one whose FIELD is made hostile,
  around a file it plants in its staging directory (the bytes start with HOSTILE_MARK and
  must never reach the corpus). FIELD is a `protocol.ResultField` value: `outcome`, `status`
  (values outside the wire's closed sets: raw msgpack, the Struct would not encode them),
  `coverage` (a summary past the campaign's map), `manifest-length` (more entries than
  `generated`), `size` (negative), `name` (upper-case hex), `duplicate` (one file listed
  twice), `missing-file`, `not-regular` (a FIFO), `staged-bytes` (bytes not those named),
  `figures` (a negative wall time), `input-hash` (other bytes than sent), `pruning` (garbage
  map bits).

Master kinds (rank 0), counting WORK sends:

- `send-fail`: the N-th WORK send raises instead of sending;
- `send-ambiguous`: the N-th WORK send delivers, then raises (F313 §4: the master cannot
  tell, undoes the dispatch as unsent, and the worker's RESULT must then be refused);
- `object-send-fail`: the N-th WORK that carries object content raises instead of sending.
"""

from __future__ import annotations

import os

from .protocol import ResultField

WORKER_KINDS = ("foreign-result", "stale-result", "malformed-result", "stop", "hostile")
# What `malformed-result` already covers (garbage bytes) is not a hostile field.
HOSTILE_FIELDS = tuple(f.value for f in ResultField if f is not ResultField.UNDECODABLE)
HOSTILE_MARK = b"hostile result: must never reach the corpus "
MASTER_KINDS = ("send-fail", "send-ambiguous", "object-send-fail")
DEFAULT_STOP_SECONDS = 5.0


class Faults:
    def __init__(self, rank: int, spec: str | None = None):
        spec = os.environ.get("SYMCC_MPI_FAULTS", "") if spec is None else spec
        self.planned: dict[tuple[str, int], str] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            target, _, rest = item.partition(":")
            kind, _, when = rest.partition("@")
            number, _, argument = when.partition("=")
            kinds = MASTER_KINDS if target == "0" else WORKER_KINDS
            if kind not in kinds or not target.isdigit() or not number.isdigit() \
                    or not _argument_fits(kind, argument):
                raise ValueError(f"SYMCC_MPI_FAULTS: cannot parse {item!r}")
            if int(target) == rank:
                self.planned[(kind, int(number))] = argument

    def fire(self, kind: str, number: int) -> bool:
        return (kind, number) in self.planned

    def stop_seconds(self, number: int) -> float:
        return float(self.planned.get(("stop", number)) or DEFAULT_STOP_SECONDS)

    def hostile_field(self, number: int) -> str | None:
        """The field to make hostile in the RESULT of dispatch `number`, if any."""
        return self.planned.get(("hostile", number))


def _argument_fits(kind: str, argument: str) -> bool:
    if kind == "hostile":
        return argument in HOSTILE_FIELDS
    return not argument or (kind == "stop" and _is_seconds(argument))


def _is_seconds(text: str) -> bool:
    try:
        return 0 < float(text) < 3600
    except ValueError:
        return False
