"""The campaign directory and what the master writes in it: layout, publishing, the done
journal and work WAL, judging and committing a RESULT, checkpoints for `--resume`, the AFL
face (fuzzer_stats, plot_data, queue names), AFL++ hybrid import, and `verify`'s oracles.

May import: scheduling, ulfm (the generation log), wire, executors, coverage, processes,
durable, config. Never MPI, never the roles."""
