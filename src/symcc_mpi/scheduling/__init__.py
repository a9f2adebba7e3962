"""What to analyse next: the frontier, every input the master knows (digests), whole inputs
split into parts among free workers, and the tiers past the interesting frontier.

May import: wire (the staged pack), coverage, processes, durable, config. Pure of MPI."""
