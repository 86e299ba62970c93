package ledger

import "errors"

// Sentinel kinds. Every error the package returns wraps one of them with
// context (the file on open, the key on reads and writes); callers branch
// with errors.Is.
var (
	// ErrNotFound: no record (or history) for that key.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a create (revision 0) found a record already there.
	ErrAlreadyExists = errors.New("already exists")
	// ErrConflict: a compare-and-set lost (the record moved on or is gone), or
	// a VM is already recorded for another pod. Re-read and decide again.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the caller passed something the ledger cannot store.
	ErrInvalid = errors.New("invalid")
	// ErrLocked: another process holds the ledger file.
	ErrLocked = errors.New("ledger is locked by another process")
	// ErrWrongLedger: the file belongs to another node or cluster (invariant I8).
	ErrWrongLedger = errors.New("ledger belongs to another node or cluster")
	// ErrSchema: the file's schema cannot be used by this build (too new, or
	// too old to read without a writable open that migrates it).
	ErrSchema = errors.New("unsupported ledger schema")
	// ErrCorrupt: the file or a value in it cannot be read.
	ErrCorrupt = errors.New("ledger is corrupt")
	// ErrNotLedger: a readable bbolt file that caa did not write.
	ErrNotLedger = errors.New("not a caa ledger")
	// ErrReadOnly: a write on a ledger opened read-only.
	ErrReadOnly = errors.New("ledger is open read-only")
	// ErrNoSpace: the file system holding the ledger refused a write for
	// lack of space or quota (ENOSPC, EDQUOT). The write did not happen;
	// the message names the file system and what to free.
	ErrNoSpace = errors.New("no space left for the ledger")
)
