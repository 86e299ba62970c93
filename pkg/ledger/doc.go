// Package ledger is caa's on-node memory: a bbolt file that maps each peer
// pod to its cloud VM and survives restarts, upgrades and crashes of the daemon.
//
// The file holds one tree of buckets:
//
//	meta
//	 ├── schema            uint32 big-endian: the layout version (see migrations.go)
//	 ├── compat            uint32 big-endian: the oldest layout version that may
//	 │                     still open the file (see "Rollback" below)
//	 ├── id                random ledger id, fixed at creation
//	 ├── node              node name this ledger belongs to (invariant I8)
//	 ├── cluster           cluster id this ledger belongs to (invariant I8)
//	 ├── createdAt         RFC 3339 creation time
//	 ├── epoch             uint64 big-endian: +1 on every writable open
//	 ├── holderPID         decimal pid of the last writable opener
//	 ├── openedAt          RFC 3339 time of the last writable open
//	 └── preflight         fingerprint ("sha256:<hex>") of the cloud settings
//	                       whose startup preflight last passed; a digest, never
//	                       a setting or a credential (optional, see Rollback)
//	records
//	 └── <pod uid>         record value (codec.go): the pod, its VM, phase, revision
//	vms
//	 └── <provider>\x00<vm id>  pod uid: the index from a cloud VM to its pod
//	history
//	 └── <pod uid>         bucket, one per pod, kept after the record is deleted
//	      │                until PruneDeleted finds it older than the retention
//	      └── <seq>        uint64 big-endian -> event value (codec.go); the
//	                       oldest entries are dropped past the per-pod limit
//	sandboxes, sandboxHistory  the kata sandboxes of the remote hypervisor
//	                       mode, keyed by sandbox id (schema 2; sandbox.go)
//
// Every write is one bbolt read-write transaction with fsync on, so it is
// durable when the call returns (invariant I2 rests on this). Writes to a
// record are compare-and-set on its revision: a stale writer gets ErrConflict.
// Helpers take a *Tx so a caller can compose several changes atomically.
//
// The file stays bounded on a node that churns pods: each pod keeps at most
// Options.HistoryLimit entries, and the daemon calls PruneDeleted
// periodically to remove the history of pods deleted longer ago than its
// retention, a few pods per write transaction. Reads that cover every pod's
// history go through HistoryPage, one short read transaction per page: a
// long read transaction would keep bbolt from remapping a growing file and
// from reusing the pages that pruning frees.
//
// bbolt allows one writing process. A writable open records its pid in a
// holder file beside the ledger (<path>.holder) so a second opener, which
// cannot read the locked file, can name who holds it. Readers that find the
// file held talk to the daemon over its unix socket instead (package
// ledger/ledgerapi).
//
// # Rollback
//
// A ledger written by caa version N+1 stays usable by version N, so that
// `kubectl rollout undo` after an update is safe. The rule every change
// of the file follows:
//
//   - A new record or event field takes a new tag. Older versions keep
//     the fields they do not know and write them back unchanged, so a roll
//     back and forward again loses nothing.
//   - A layout change is a migration. An additive one (a new bucket, or a
//     meta key that every file must hold) bumps schema but not compat: an
//     older caa opens the file as it is, without migrating it down, and
//     logs that a newer caa wrote it.
//   - A change an older caa could not use safely is a Breaking migration:
//     it raises compat, and every caa whose schema is below compat refuses
//     the file with ErrSchema, naming the version to run. A breaking
//     migration must ship one release after a release that can already
//     read the new layout, so that the rollback of an update never crosses
//     it. No breaking migration exists after the initial layout.
//
// A new optional meta key that older builds never read needs no migration
// and no schema bump: readMeta and Verify look up the keys they know and
// ignore the rest, and no writer removes a key it does not know. That is
// how meta/preflight was added: a ledger with it opens in an older caa as
// before, and one without it reads as "no preflight recorded".
//
// Files written before compat existed have no compat key; their compat is
// their schema, the rule they were written under.
package ledger
