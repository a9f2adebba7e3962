"""A several-master job's figures: each master's federation statistics, and root's of the
campaign (its own and the others' latest, combined)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from symcc_mpi.campaign.report import CampaignSnapshot
from symcc_mpi.federation.hints import HintStatistics
from symcc_mpi.federation.map_exchange import ExchangeStatistics
from symcc_mpi.federation.master_leases import LeaseFigures
from symcc_mpi.federation.quiescence import CoordinatorStatistics, ParticipantStatistics
from symcc_mpi.federation.target_claims import ClaimStatistics

SUMMED = ("executions", "generated", "unique", "interesting", "crashes", "hangs",
          "crashing_runs", "hanging_runs", "executor_time", "solver_time")
CURRENT = ("pending", "workers")  # of the living masters: a dead one's are its successor's
LATEST = ("max_depth", "last_find", "last_crash", "last_hang")


@dataclass(frozen=True)
class FederationStatistics:
    """One master's part of a several-master job; root's also has the quiescence protocol's
    coordinator and the findings it named for the others."""

    leases: LeaseFigures
    not_owned: int
    stale_results: int
    targets: ClaimStatistics | None
    hints: HintStatistics
    maps: ExchangeStatistics
    quiescence: ParticipantStatistics
    quiescence_root: CoordinatorStatistics | None
    root_outcome: str | None
    findings_named: int | None

    def to_json(self) -> dict:
        """As stats.json's extra.federation has it: the lease figures at the top level."""
        figures = asdict(self.leases)
        figures.update(not_owned=self.not_owned, stale_results=self.stale_results,
                       targets=asdict(self.targets) if self.targets else {},
                       hints=asdict(self.hints), maps=asdict(self.maps),
                       quiescence=asdict(self.quiescence))
        if self.quiescence_root is not None:
            figures["quiescence_root"] = {**asdict(self.quiescence_root),
                                          "outcome": self.root_outcome}
            figures["findings_named"] = self.findings_named
        return figures


def combine(own: CampaignSnapshot, others: dict[int, dict], departed: list[dict] = (),
            successions: list[dict] = ()) -> CampaignSnapshot:
    """Root's snapshot of the whole campaign: its own figures and the latest of each other
    master's, summed (the latest events: the latest of all), with the last figures of the
    masters that died and were replaced (`departed`); workers named by world rank, and a
    breakdown by master in `extra["per_master"]`. The failures survived are every master's,
    and each succession as root heard of it (`successions`) unless its successor's figures
    hold it (with the time work went out again): a successor may die before they arrive."""
    masters = {0: asdict(own), **others}
    everyone = [*masters.values(), *departed]
    combined = {name: sum(m.get(name) or 0 for m in everyone) for name in SUMMED}
    combined.update((name, sum(m.get(name) or 0 for m in masters.values())) for name in CURRENT)
    for name in LATEST:
        values = [m[name] for m in masters.values() if m.get(name) is not None]
        combined[name] = max(values) if values else getattr(own, name)
    per_worker = {}
    per_master = {}
    for index, figures in sorted(masters.items()):
        extra = figures.get("extra", {})
        world = extra.get("world_ranks") or []
        for rank, worker in figures.get("per_worker", {}).items():
            if int(rank) < len(world):
                per_worker[world[int(rank)]] = worker
        federation = extra.get("federation", {})
        per_master[str(index)] = {
            "world_rank": world[0] if world else None, "workers": figures.get("workers", 0),
            "executions": figures.get("executions", 0),
            "interesting": figures.get("interesting", 0),
            "crashes": figures.get("crashes", 0), "pending": figures.get("pending", 0),
            "in_flight": extra.get("in_flight", 0), "phase": extra.get("phase", "?"),
            "loop_cpu_seconds": extra.get("master_loop_cpu_seconds", 0.0),
            **{name: federation.get(name, 0) for name in (
                "claims", "steals", "expiries", "stale_results", "refused", "not_owned",
                "writes", "lock_wait_seconds")},
            "splitting": extra.get("splitting", {}),
            "target_claims": federation.get("targets", {}),
            "maps": federation.get("maps", {})}
    extra = dict(own.extra, per_master=per_master,
                 executor_errors=sum(m.get("extra", {}).get("executor_errors") or 0
                                     for m in everyone),
                 executor_failures=_failures([m.get("extra", {}).get("executor_failures")
                                              for m in everyone]),
                 failures=_survived(everyone, successions))
    return replace(own, per_worker=per_worker, extra=extra, **combined)


def _survived(everyone: list[dict], successions: list[dict]) -> list[dict]:
    reported = [{"master_index": figures.get("extra", {}).get("master_index", 0), **failure}
                for figures in everyone
                for failure in figures.get("extra", {}).get("failures") or ()]
    known = {(f["master_index"], tuple(f["failed"])) for f in reported}
    reported += [f for f in successions if (f["master_index"], tuple(f["failed"])) not in known]
    return sorted(reported, key=lambda failure: failure.get("detected") or 0)


def _failures(per_master: list[list[dict] | None]) -> list[dict]:
    """The masters' executor failures (progress.py), one group per reason, most first."""
    groups: dict[str, dict] = {}
    for figures in per_master:
        for group in figures or ():
            if group["reason"] in groups:
                groups[group["reason"]]["count"] += group["count"]
            else:
                groups[group["reason"]] = dict(group)
    return sorted(groups.values(), key=lambda group: -group["count"])


def plain(value):
    """A snapshot as msgpack carries it: dict keys as strings, tuples as lists."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value
