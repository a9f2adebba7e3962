"""The MPI loops: a master composes the dispatch coordinator, corpus and triage; workers execute."""
