"""Tiers of work past the interesting frontier: a campaign with a budget keeps every worker
busy once triage has nothing left for it.

- tier 1, the interesting frontier: seeds, the children triage kept, the fuzzers' finds;
- tier 2, the aside pool (`pool.py`): children new by content that triage did not keep,
  bounded on disk and ranked by promise, explored best first;
- tier 3, a new *epoch* (`schedule.py`): the whole corpus analysed again under a fresh
  QSYM pruning map, so that the branches pruning skipped in one context are solved in
  others.

Whatever a lower tier finds that adds coverage goes to tier 1, and tier 1 always goes first.
Without a budget (`--wall-timeout`, `--max-idle`) a campaign ends with its interesting
frontier, as before; the pool is kept for a `--resume` with one.
"""
