"""The MPI loops: a master composes the scheduler, corpus and triage; workers execute."""
