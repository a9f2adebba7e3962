"""Which tier the next work comes from, and when a new epoch begins: pure, no I/O.

Tier 1 always goes first (the dispatch coordinator takes the interesting frontier before it
asks here). Below it, the schedule is in one of two modes:

- ASIDE: the aside pool, best first, for as long as it pays: after `patience` executions
  of lower tiers without a find (a kept child or a new crash) it has stopped paying, and an
  epoch is due; an empty pool makes one due too;
- RERUN: the corpus analysed again in the current epoch, to its end; then ASIDE again.

An epoch begins only when no work is in flight (the master drains first): the fresh pruning
map then holds nothing of the epoch before, and every journal record of the epoch's work
carries its number. Patience is the corpus's size (at least PATIENCE_FLOOR): the pool gets as
many fruitless executions as a re-run of the corpus would cost, so neither tier starves.
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


@dataclass
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
        self.current = Tier.INTERESTING
        self.figures = {tier: TierFigures() for tier in Tier}

    def patience(self, corpus: int) -> int:
        return max(self.patience_floor, corpus)

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
                self.since_find = 0
        if pool and (self.since_find < self.patience(corpus) or not self.rerun):
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
        self.since_find = 0
        return self.epoch

    def dispatched(self, tier: int) -> None:
        self.current = Tier(tier)

    def committed(self, tier: int, *, finds: int, edges: int) -> None:
        tier = Tier(tier)
        figures = self.figures[tier]
        figures.executions += 1
        figures.finds += finds
        figures.edges += edges
        if finds:
            self.since_find = 0
        elif tier is not Tier.INTERESTING:
            self.since_find += 1

    def statistics(self) -> TierStatistics:
        return TierStatistics(enabled=self.enabled, current=int(self.current),
                              mode=int(self.mode), epoch=self.epoch,
                              since_find=self.since_find,
                              per_tier={int(t): asdict(f) for t, f in self.figures.items()})
