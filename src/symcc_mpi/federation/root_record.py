"""What only the first master knows, kept in the job's lease directory for a worker of its
group that takes its place (job/federated.py): the end it decided, the figures it holds for
the campaign, and which masters said farewell.

- `decision`: the token of root's COMMIT (F320 §2.5), durable before the COMMIT goes out, as
  a two-phase coordinator logs its decision. A successor that finds it tells the others the
  end holds; one that does not voids every PREPARE (no COMMIT of it can have gone out).
- `root.json`: root's own last figures (the campaign's start time among them), those of the
  masters that died before it, the successions it heard of, when the budget began and why it
  stopped (if it did); rewritten
  with each report (once a second), so a successor's summary counts what the dead one did.
- `farewell-K.json`: master K closed its part, with its final figures and, if it stopped
  before the end, why (the STOP it sent root): its messages may have gone to a dead root, and
  a master that said farewell is gone. A new root reads them as they come.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.wire.control import TOKEN_BYTES

log = logging.getLogger(__name__)

DECISION = "decision"
ROOT_FIGURES = "root.json"
FAREWELL = re.compile(r"farewell-([0-9]+)\.json")
_TOKEN = re.compile(f"[0-9a-f]{{{2 * TOKEN_BYTES}}}")


@dataclass(frozen=True)
class Departure:
    """A master's farewell on record: its final figures, and why it stopped, if it did."""

    figures: dict
    stop: str | None = None  # the reason of the STOP it sent root
    failure: bool = False  # that STOP was for a rank's death


@dataclass
class Inheritance:
    """What a successor of the first master finds of it."""

    decided: str | None = None  # the COMMIT token, if the end was decided
    departed: list[dict] = field(default_factory=list)  # figures of masters no more
    successions: list[dict] = field(default_factory=list)
    findings: int = 0  # findings root named for the others
    start_time: float | None = None  # the campaign's, as its reports say (Unix time)
    budget_start: float | None = None  # Unix time
    ending: str = ""  # why root stopped the campaign, if it did
    farewells: dict[int, Departure] = field(default_factory=dict)


class RootRecord:
    def __init__(self, directory: Path):
        self.directory = directory

    def decide(self, token: str) -> None:
        write_durable(self.directory / DECISION, token.encode())

    def keep(self, *, own: dict, departed: list[dict], successions: list[dict], findings: int,
             budget_start: float, ending: str) -> None:
        document = {"departed": [own, *departed], "successions": successions,
                    "findings": findings, "budget_start": budget_start, "ending": ending}
        # Not fsynced: a report a second; after a crash of the machine the job is over anyway.
        write_durable(self.directory / ROOT_FIGURES, json.dumps(document).encode(),
                      fsync=False)

    def farewell(self, index: int, figures: dict, stop: tuple[str, bool] | None) -> None:
        document = {"figures": figures, "stop": list(stop) if stop is not None else None}
        write_durable(self.directory / f"farewell-{index}.json", json.dumps(document).encode())

    def farewells(self) -> dict[int, Departure]:
        found = {}
        for path in self.directory.glob("farewell-*.json"):
            if (match := FAREWELL.fullmatch(path.name)) is None:
                continue
            document = self._read(path)
            document = document if isinstance(document, dict) else {}
            figures = document.get("figures")
            stop = document.get("stop")
            stopped = isinstance(stop, list) and len(stop) == 2 and isinstance(stop[0], str)
            found[int(match[1])] = Departure(figures if isinstance(figures, dict) else {},
                                             stop[0] if stopped else None,
                                             bool(stop[1]) if stopped else False)
        return found

    def inherit(self) -> Inheritance:
        """What the dead root left; a file that is missing or damaged leaves its part empty
        (the campaign goes on: only figures and the farewells' shortcut are lost)."""
        found = Inheritance()
        try:
            token = (self.directory / DECISION).read_text().strip()
            if _TOKEN.fullmatch(token):
                found.decided = token
            else:
                log.warning("%s: not a decision token: ignored", self.directory / DECISION)
        except FileNotFoundError:
            pass
        document = self._read(self.directory / ROOT_FIGURES)
        if isinstance(document, dict):
            found.departed = _dicts(document.get("departed"))
            found.successions = _dicts(document.get("successions"))
            found.findings = _number(document.get("findings"), int) or 0
            found.budget_start = _number(document.get("budget_start"), float)
            if found.departed:
                found.start_time = _number(found.departed[0].get("start_time"), float)
            found.ending = document.get("ending") if isinstance(document.get("ending"),
                                                                 str) else ""
        found.farewells = self.farewells()
        return found

    @staticmethod
    def _read(path: Path):
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            log.warning("%s: unreadable (%s): ignored", path, error)
            return None


def _dicts(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _number(value, kind):
    return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
