"""The campaign's durable state on disk, pure of MPI (F443 §2's two layers, one home).

What the package holds:
- `journal.py`: the one journal implementation (`LineLog`: checksummed append-only JSONL,
  torn-tail repair, group appends). corpus.py makes `OUT/state/done.jsonl` of it: the done
  journal and F443's work WAL (dispatch and commit records); the deferred-work journal
  (F317) is one too.
- `generations.py`: `OUT/state/generations.jsonl`, F443's recovery state (generation,
  members, each recovery's plan and receipt), in the journal's line format.
- `atomic.py`: the one atomic-write helper (`write_durable`).
- `clock.py`: the injected clock the journals, the dispatch deadlines and the leases read.
- `leases.py`, `master_leases.py`, `hints.py`: the several-master job's shared table (F320,
  issue 11), under `OUT/.standalone-work-<epoch>/` for one job only: fenced work leases, a
  master's handle on them, and the masters' publication logs (hints, never the authority).
- `target_leases.py`: F311's target-group leases that the masters share
  (`OUT/.target_lease_table/`): one target solved by one master at a time, whatever the seed.
- `locks.py`: the lease tables' bounded lock-directory lock (F320 §2.6).

Two locks. `flock`, in two places with two scopes: corpus.py's campaign lock
(`OUT/state/master.lock`, held for the master's whole life: one writer of done.jsonl) and the
generation log's, held around one read-decide-append (several survivors of a failure write
that log in turn). And locks.py's lock directory for the lease table, because its holders are
masters on several hosts that must wait with a deadline and never break a lock for its age
(F320 §2.6, F321); it uses `flock` only to prove a holder on this kernel dead.

Filesystem semantics the campaign directory relies on, so that a master started on another
node after a failure can rebuild the campaign from it alone:
- atomic `rename` within one directory, and `fsync` of a file then of its directory
  (atomic.py);
- O_APPEND writes, each record or group in one `write`, by one writer at a time (journal.py,
  generations.py): a killed writer leaves at most one torn last line;
- `flock` that excludes across hosts (local filesystems; NFS, where Linux maps it to byte-range
  locks; not a filesystem mounted with node-local flock, e.g. Lustre with `localflock`);
- close-to-open visibility: what one node fsynced, another node that opens the file afterwards
  reads (NFS gives this). SQLite in WAL mode, for one, needs shared memory between its users
  and so does not work across hosts, which is why no state here lives in SQLite.
"""
