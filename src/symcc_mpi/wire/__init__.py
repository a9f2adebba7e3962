"""What travels between ranks: the typed, strictly decoded messages (protocol), the
quiescence protocol's messages (control), raw-bytes MPI messaging (transport), the doorbell
that wakes a master, and the staged pack a worker hands its master.

May import: executors (outcomes), coverage (probe statuses), processes, durable, config."""
