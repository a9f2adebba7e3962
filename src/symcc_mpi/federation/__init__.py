"""Several masters in one job: rendezvous ownership, the shared fenced work-lease and target
tables with their lock and publication logs, hints, the two-phase end of a campaign
(quiescence, F320) and the AFL face they share.

May import: campaign, scheduling, ulfm, wire, coverage, processes, durable, config."""
