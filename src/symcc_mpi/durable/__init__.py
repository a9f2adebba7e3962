"""The campaign's durable state on disk, pure of MPI (F443 §2's two layers, one home).

What the package holds:
- `journal.py`: the one journal implementation (`LineLog`: checksummed append-only JSONL,
  torn-tail repair, group appends, or bare lines of its owner's `encode`). Every append-only
  log stands on it: the done journal and F443's work WAL (campaign/done_log.py, its records
  campaign/wal.py), the deferred-work journal (F317), the generation log (ulfm/generations.py),
  the masters' publication hints (federation/hints.py), AFL's plot_data, quarantine/REASONS.
- `lines.py`: the journals' checksummed line format, and the write step a test may replace.
- `atomic.py`: the one atomic-write helper (`write_durable`), its hard-link variant
  (`publish_link`, AFL's queue/) and the group commit's deferred fsync (`fsync_once`).
- `locks.py`: every lock: the campaign's flock (`FileLock` on `OUT/state/master.lock`), the
  generation log's (`flocked`), and the lease tables' bounded lock directory (F320 §2.6).
- `clock.py`: the injected clock the journals, the dispatch deadlines and the leases read.
- `regular.py`: listing and opening regular files only, never a link.
- `storage.py`: a filesystem that refuses writes, recognised and said in one line.

Two kinds of lock. `flock`, in two places with two scopes: the campaign lock, held for the
master's whole life (one writer of done.jsonl), and the generation log's, held around one
read-decide-append (several survivors of a failure write that log in turn). And the lock
directory for the lease table, because its holders are masters on several hosts that must
wait with a deadline and never break a lock for its age (F320 §2.6, F321); it uses `flock`
only to prove a holder on this kernel dead.

Filesystem semantics the campaign directory relies on, so that a master started on another
node after a failure can rebuild the campaign from it alone:
- atomic `rename` within one directory, and `fsync` of a file then of its directory
  (atomic.py);
- O_APPEND writes, each record or group in one `write`, by one writer at a time (journal.py;
  the generation log's writers take turns under its flock): a killed writer leaves at most
  one torn last line;
- `flock` that excludes across hosts (local filesystems; NFS, where Linux maps it to byte-range
  locks; not a filesystem mounted with node-local flock, e.g. Lustre with `localflock`);
- close-to-open visibility: what one node fsynced, another node that opens the file afterwards
  reads (NFS gives this). SQLite in WAL mode, for one, needs shared memory between its users
  and so does not work across hosts, which is why no state here lives in SQLite.
"""
