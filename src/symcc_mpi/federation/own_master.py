"""What a federation (masters.py, succession.py) sees of its own master."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.scheduling.frontier import Frontier


@dataclass(frozen=True)
class OwnMaster:
    """The parts of its own master a federation reads and feeds, and nothing more."""

    frontier: Frontier  # discovered and recovered inputs join it
    campaign: CampaignDir  # corpus/ to rescan; root names the others' findings in it
    count_malformed: Callable[[], object]  # a malformed message from another master
    exhausted: Callable[[], bool]  # nothing of this master's left to dispatch
    busy: Callable[[], bool]  # results in flight, or parts of a split input waiting
    give_up_splits: Callable[[], list[str]]  # its split inputs go whole to their new owner
    checkpoint: Checkpointer  # its triage and pruning maps, which gain the others' bits
