"""Coverage: AFL edge summaries and the campaign's virgin-bits map (triage), the worker's
probe through the AFL build's forkserver, and QSYM's pruning map shared between ranks.

May import: processes, durable, config. Pure of MPI."""
