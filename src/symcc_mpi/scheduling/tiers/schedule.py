"""Which tier the next work comes from, and when a new epoch begins: pure, no I/O.

Tier 1 always goes first (the dispatch coordinator takes the interesting frontier before it
asks here). Below it, the schedule is in one of two modes:

- ASIDE: the aside pool, best first, for as long as it pays: once lower tiers have gone
  without a find (a kept child or a new crash) for `patience` executions and for as many
  worker-seconds as a re-run of the corpus would cost, it has stopped paying, and an epoch is
  due; an empty pool makes one due too;
- RERUN: the corpus analysed again in the current epoch, to its end; then ASIDE again.

An epoch begins only when no work is in flight (the master drains first): the fresh pruning
map then holds nothing of the epoch before, and every journal record of the epoch's work
carries its number. Patience is the corpus's size (at least PATIENCE_FLOOR) in executions,
and the re-run's expected cost in worker-seconds (the corpus's size times the mean run of the
re-runs so far, or of tier 1 before any: both meet a map that knows little of them). The pool
gets as much fruitless work as a re-run would cost, so neither tier starves: counted in
executions alone, the pool's runs, mostly pruned, cost a fifth of a re-run's (json: 10 ms
against 50), and 120 s went to fourteen epochs that found 5 inputs while 4,363 set-aside
children waited.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field

PATIENCE_FLOOR = 100


class Tier(enum.IntEnum):
    INTERESTING = 1
    ASIDE = 2
    RERUN = 3


@dataclass
class TierFigures:
    executions: int = 0
    finds: int = 0  # children kept (new coverage) and new unique crashes
    edges: int = 0  # edges those finds added to the triage map
    seconds: float = 0.0  # the executor's wall time over those executions


@dataclass(frozen=True)
class TierStatistics:
    enabled: bool
    current: int  # the tier of the last work that went out
    mode: int  # the lower tier in use: 2 or 3
    epoch: int
    since_find: int
    per_tier: dict[int, dict] = field(default_factory=dict)


class TierSchedule:
    """`aside`: the pool may be used (the campaign triages); `rerun`: epochs may begin (its
    runs prune, so a fresh map changes what is solved); `enabled`: the campaign has a
    budget, else it stops with its interesting frontier and the pool waits for a resume."""

    def __init__(self, *, enabled: bool, aside: bool, rerun: bool, epoch: int = 0,
                 patience_floor: int = PATIENCE_FLOOR):
        self.enabled = enabled and (aside or rerun)
        self.aside = aside
        self.rerun = rerun
        self.epoch = epoch
        self.patience_floor = patience_floor
        self.mode = Tier.ASIDE if aside else Tier.RERUN
        self.since_find = 0
        self.since_find_seconds = 0.0
        self.current = Tier.INTERESTING
        self.figures = {tier: TierFigures() for tier in Tier}

    def patience(self, corpus: int) -> int:
        return max(self.patience_floor, corpus)

    def rerun_cost(self, corpus: int) -> float:
        """The worker-seconds a re-run of `corpus` inputs is expected to take (0: unknown)."""
        for tier in (Tier.RERUN, Tier.INTERESTING):
            figures = self.figures[tier]
            if figures.executions:
                return corpus * figures.seconds / figures.executions
        return 0.0

    def _pool_pays(self, corpus: int) -> bool:
        return self.since_find < self.patience(corpus) \
            or self.since_find_seconds < self.rerun_cost(corpus)

    def source(self, *, pool: int, reruns: int, corpus: int) -> Tier | None:
        """The lower tier the next work comes from; None: nothing now (an epoch may be due,
        `epoch_due`). `pool`, `reruns`: what waits in each; `corpus`: its size."""
        if not self.enabled:
            return None
        if self.mode is Tier.RERUN:
            if reruns:
                return Tier.RERUN
            if self.aside:  # the epoch's re-run is over: the pool again, patience anew
                self.mode = Tier.ASIDE
                self._patience_anew()
        if pool and (not self.rerun or self._pool_pays(corpus)):
            return Tier.ASIDE
        return None

    def epoch_due(self, *, pool: int, reruns: int, corpus: int) -> bool:
        return (self.enabled and self.rerun and corpus > 0
                and self.source(pool=pool, reruns=reruns, corpus=corpus) is None)

    def has_work(self, *, pool: int, reruns: int, corpus: int) -> bool:
        """Whether a lower tier has work now or after an epoch begins."""
        return self.source(pool=pool, reruns=reruns, corpus=corpus) is not None \
            or self.epoch_due(pool=pool, reruns=reruns, corpus=corpus)

    def begin_epoch(self) -> int:
        self.epoch += 1
        self.mode = Tier.RERUN
        self._patience_anew()
        return self.epoch

    def _patience_anew(self) -> None:
        self.since_find = 0
        self.since_find_seconds = 0.0

    def dispatched(self, tier: int) -> None:
        self.current = Tier(tier)

    def committed(self, tier: int, *, finds: int, edges: int, seconds: float) -> None:
        tier = Tier(tier)
        figures = self.figures[tier]
        figures.executions += 1
        figures.finds += finds
        figures.edges += edges
        figures.seconds += seconds
        if finds:
            self._patience_anew()
        elif tier is not Tier.INTERESTING:
            self.since_find += 1
            self.since_find_seconds += seconds

    def statistics(self) -> TierStatistics:
        return TierStatistics(enabled=self.enabled, current=int(self.current),
                              mode=int(self.mode), epoch=self.epoch,
                              since_find=self.since_find,
                              per_tier={int(t): asdict(f) for t, f in self.figures.items()})
