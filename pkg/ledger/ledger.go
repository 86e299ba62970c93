package ledger

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Defaults for Options.
const (
	DefaultPath         = "/var/lib/caa/ledger.db"
	DefaultOpenTimeout  = 10 * time.Second
	DefaultHistoryLimit = 50

	fileMode = 0o600
	dirMode  = 0o700
)

// Options configure Open.
type Options struct {
	// Path of the ledger file. Required.
	Path string
	// Node and Cluster identify the owner. A writable open requires both and
	// refuses a file written for another (invariant I8). A read-only open
	// checks only what is given.
	Node    string
	Cluster string
	// Timeout bounds the wait for the file lock (default DefaultOpenTimeout).
	Timeout time.Duration
	// ReadOnly opens with a shared lock and refuses writes.
	ReadOnly bool
	// HistoryLimit bounds the entries kept per pod (default DefaultHistoryLimit).
	HistoryLimit int
	// Logger receives open, migration and close messages (default: discard).
	Logger *slog.Logger
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
	// Preflight, on a writable open, is recorded as meta/preflight in the
	// open's own transaction: the fingerprint of the cloud settings whose
	// preflight this caa has passed (or found already recorded). Empty
	// leaves the recorded one as it is.
	Preflight string
}

// Meta is what the meta bucket says about the ledger.
type Meta struct {
	SchemaVersion int       `json:"schemaVersion"`
	ID            string    `json:"id"`
	Node          string    `json:"node"`
	Cluster       string    `json:"cluster"`
	CreatedAt     time.Time `json:"createdAt"`
	OpenEpoch     uint64    `json:"openEpoch"`
	HolderPID     int       `json:"holderPID,omitempty"`
	OpenedAt      time.Time `json:"openedAt,omitzero"`
	// Preflight is the fingerprint of the cloud settings whose preflight
	// last passed on this ledger ("" when none is recorded); see
	// Options.Preflight.
	Preflight string `json:"preflight,omitempty"`
}

// Ledger is an open ledger file. It is safe for concurrent use.
type Ledger struct {
	db *bolt.DB
	// sandboxWrites counts the sandbox writes in flight: a write alone
	// commits at once, writes side by side share commits (batch).
	sandboxWrites atomic.Int32
	path          string
	readOnly      bool
	meta          Meta
	historyLimit  int
	now           func() time.Time
	log           *slog.Logger

	closeOnce sync.Once
	closeErr  error
}

var (
	bucketMeta    = []byte("meta")
	bucketRecords = []byte("records")
	bucketVMs     = []byte("vms")
	bucketHistory = []byte("history")

	keySchema    = []byte("schema")
	keyCompat    = []byte("compat")
	keyID        = []byte("id")
	keyNode      = []byte("node")
	keyCluster   = []byte("cluster")
	keyCreatedAt = []byte("createdAt")
	keyEpoch     = []byte("epoch")
	keyHolderPID = []byte("holderPID")
	keyOpenedAt  = []byte("openedAt")
	keyPreflight = []byte("preflight")
)

// maxKeyLen keeps keys far below bbolt's limit and sane to print.
const maxKeyLen = 512

// Open opens (a writable open creates) the ledger at opts.Path, waits at most
// opts.Timeout for the file lock, migrates an older schema and checks that
// the file belongs to opts.Node and opts.Cluster.
func Open(opts Options) (l *Ledger, err error) {
	if opts.Path == "" {
		return nil, fmt.Errorf("open ledger: %w: no path given", ErrInvalid)
	}
	if !opts.ReadOnly && (opts.Node == "" || opts.Cluster == "") {
		return nil, fmt.Errorf("open ledger %s: %w: a writable open needs the node name and the cluster id", opts.Path, ErrInvalid)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultOpenTimeout
	}
	if opts.HistoryLimit <= 0 {
		opts.HistoryLimit = DefaultHistoryLimit
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l = &Ledger{
		path:         opts.Path,
		readOnly:     opts.ReadOnly,
		historyLimit: opts.HistoryLimit,
		now:          opts.Now,
		log:          opts.Logger.With("ledger", opts.Path),
	}

	created, err := prepareFiles(opts.Path, opts.ReadOnly)
	if err != nil {
		return nil, l.noSpace(err)
	}

	var file *os.File
	err = guard(func() error {
		var oerr error
		l.db, oerr = bolt.Open(opts.Path, fileMode, &bolt.Options{
			// Take the lock here, before bbolt asks for it on the same file
			// (and gets it at once), so that a long wait can be told.
			OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
				f, err := os.OpenFile(name, flag, perm)
				if err != nil {
					return nil, err
				}
				if err := l.awaitLock(f, opts.ReadOnly, opts.Timeout); err != nil {
					_ = f.Close()
					return nil, err
				}
				file = f
				return f, nil
			},
			Timeout:  opts.Timeout,
			ReadOnly: opts.ReadOnly,
			// Durability is the point of the ledger: keep fsync on.
			NoSync:       false,
			FreelistType: bolt.FreelistMapType,
		})
		if l.db != nil {
			// A write alone waits this long for others to share its
			// commit (batch); bbolt's 10 ms default would add that to
			// every sandbox write of a lone StartVM.
			l.db.MaxBatchDelay = batchDelay
		}
		return oerr
	})
	if err != nil {
		if l.db == nil && file != nil && errors.Is(err, ErrCorrupt) {
			// bbolt panicked inside Open, holding the lock and a mapping
			// that keeps the file open: release the lock by hand so the
			// next opener is not told another process holds it.
			_ = syscall.Flock(int(file.Fd()), syscall.LOCK_UN)
			_ = file.Close()
		}
		return nil, l.openError(err, opts.Timeout)
	}
	db := l.db // l is nil by the time a failed open's deferred close runs
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()

	if err := l.checkSize(); err != nil {
		return nil, err
	}
	if opts.ReadOnly {
		err = l.loadReadOnly(opts)
	} else {
		err = l.initWritable(opts)
	}
	if err != nil {
		return nil, err
	}
	if created {
		if err := syncDir(filepath.Dir(opts.Path)); err != nil {
			return nil, fmt.Errorf("open ledger %s: sync directory: %w", opts.Path, err)
		}
	}
	if !opts.ReadOnly {
		if err := writeHolder(l.holderPath(), Holder{PID: os.Getpid(), Epoch: l.meta.OpenEpoch, OpenedAt: l.meta.OpenedAt}); err != nil {
			l.log.Warn("cannot record the lock holder beside the ledger", "err", err)
		}
	}
	l.log.Info("ledger open", "id", l.meta.ID, "node", l.meta.Node, "cluster", l.meta.Cluster,
		"schema", l.meta.SchemaVersion, "epoch", l.meta.OpenEpoch, "readOnly", opts.ReadOnly)
	return l, nil
}

// prepareFiles makes the directory 0700 and the file 0600 (tightening looser
// modes) for a writable open, and reports whether the file is new.
func prepareFiles(path string, readOnly bool) (created bool, err error) {
	info, statErr := os.Stat(path)
	switch {
	case statErr == nil && info.IsDir():
		return false, fmt.Errorf("open ledger %s: %w: it is a directory; --ledger names the file, e.g. %s", path, ErrInvalid, DefaultPath)
	case readOnly && errors.Is(statErr, fs.ErrNotExist):
		return false, fmt.Errorf("open ledger %s: %w: no such file (check --ledger; `caa run` creates it)", path, ErrNotFound)
	case readOnly && statErr == nil && info.Size() == 0:
		return false, fmt.Errorf("open ledger %s: %w: the file is empty", path, ErrNotLedger)
	case readOnly:
		return false, nil
	case statErr != nil && !errors.Is(statErr, fs.ErrNotExist):
		return false, fmt.Errorf("open ledger %s: %w", path, statErr)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return false, fmt.Errorf("open ledger %s: create directory: %w", path, err)
	}
	if err := tighten(dir, dirMode); err != nil {
		return false, fmt.Errorf("open ledger %s: %w", path, err)
	}
	if statErr == nil {
		return false, tighten(path, fileMode)
	}
	return true, nil
}

// tighten removes permission bits beyond want; it never widens.
func tighten(path string, want fs.FileMode) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if info.Mode().Perm()&^want != 0 {
		if err := os.Chmod(path, info.Mode().Perm()&want); err != nil {
			return fmt.Errorf("restrict mode of %s to %o: %w", path, want, err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// lockNotice is how long an open waits for the file lock before it logs
// who holds it.
var lockNotice = time.Second

// lockPoll is how often a waiting open tries the lock again (as bbolt does).
const lockPoll = 50 * time.Millisecond

// batchDelay is how long a batched write waits for others to share its
// commit: about the time of one commit's fsyncs on a node's disk.
const batchDelay = 2 * time.Millisecond

// awaitLock takes the file lock bbolt is about to take (exclusive, or
// shared for a read-only open), trying every lockPoll until timeout. Past
// lockNotice it logs, once, which process holds the file and how long it
// will wait: a daemon that starts while another holds its ledger would
// otherwise say nothing for the whole timeout. It returns bbolt's
// ErrTimeout when the lock stays held, which openError explains.
func (l *Ledger) awaitLock(f *os.File, readOnly bool, timeout time.Duration) error {
	how := syscall.LOCK_EX
	if readOnly {
		how = syscall.LOCK_SH
	}
	fd := int(f.Fd())
	start := time.Now()
	told := false
	for {
		err := syscall.Flock(fd, how|syscall.LOCK_NB)
		if err == nil {
			if told {
				l.log.Info("ledger lock acquired", "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("lock the file: %w", err)
		}
		waited := time.Since(start)
		if waited+lockPoll > timeout {
			return berrors.ErrTimeout
		}
		if !told && waited >= lockNotice {
			told = true
			attrs := []any{"holder", describeHolder(l.holderPath()), "waited", waited.Round(time.Millisecond), "timeout", timeout}
			if h, err := ReadHolder(l.holderPath()); err == nil {
				attrs = append(attrs, "holderPID", h.PID)
			}
			l.log.Warn("ledger is locked by another process; waiting for it, up to the timeout", attrs...)
		}
		time.Sleep(lockPoll)
	}
}

// openError turns bbolt's open failures into errors that say what to do.
func (l *Ledger) openError(err error, timeout time.Duration) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("open ledger %s: %w: %s did not release it within %s; "+
			"if caa is running, use `caa ledger` commands (they ask it over its socket) or stop it first",
			l.path, ErrLocked, describeHolder(l.holderPath()), timeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch),
		errors.Is(err, berrors.ErrChecksum), errors.Is(err, ErrCorrupt):
		return fmt.Errorf("open ledger %s: %w: not a readable bbolt file (%v); "+
			"keep the file for inspection and move it aside", l.path, ErrCorrupt, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("open ledger %s: %w (run as the user that owns it, normally root)", l.path, err)
	case isNoSpace(err):
		return fmt.Errorf("open ledger: %w", l.noSpace(err))
	}
	return fmt.Errorf("open ledger %s: %w", l.path, err)
}

// checkSize refuses a file shorter than its own meta page says it is: a
// truncated file would fault on the first read past its end.
func (l *Ledger) checkSize() error {
	info, err := os.Stat(l.path)
	if err != nil {
		return fmt.Errorf("open ledger %s: %w", l.path, err)
	}
	return l.view(func(tx *bolt.Tx) error {
		if want := tx.Size(); info.Size() < want {
			return fmt.Errorf("open ledger %s: %w: file is %d bytes but its pages need %d (truncated); "+
				"keep the file for inspection and move it aside", l.path, ErrCorrupt, info.Size(), want)
		}
		return nil
	})
}

func (l *Ledger) initWritable(opts Options) error {
	now := l.now().UTC()
	return l.update(func(tx *bolt.Tx) error {
		m, err := readMeta(tx)
		if err != nil {
			return fmt.Errorf("open ledger %s: %w", l.path, err)
		}
		fresh := m.SchemaVersion == 0
		if fresh && !isEmpty(tx) {
			return fmt.Errorf("open ledger %s: %w: the file holds buckets but no caa meta; point --ledger at caa's own file", l.path, ErrNotLedger)
		}
		if err := migrate(tx, m.SchemaVersion, migrations, l.log); err != nil {
			return fmt.Errorf("open ledger %s: %w", l.path, err)
		}
		meta := tx.Bucket(bucketMeta)
		if fresh {
			id, err := newID()
			if err != nil {
				return err
			}
			if err := putAll(meta, keyID, []byte(id), keyNode, []byte(opts.Node), keyCluster, []byte(opts.Cluster),
				keyCreatedAt, []byte(now.Format(time.RFC3339Nano))); err != nil {
				return err
			}
		} else if err := checkOwner(l.path, m, opts.Node, opts.Cluster); err != nil {
			return err
		}
		epoch := binary.BigEndian.AppendUint64(nil, m.OpenEpoch+1)
		if err := putAll(meta, keyEpoch, epoch, keyHolderPID, []byte(strconv.Itoa(os.Getpid())),
			keyOpenedAt, []byte(now.Format(time.RFC3339Nano))); err != nil {
			return err
		}
		if opts.Preflight != "" {
			if err := putAll(meta, keyPreflight, []byte(opts.Preflight)); err != nil {
				return err
			}
		}
		l.meta, err = readMeta(tx)
		return err
	})
}

func (l *Ledger) loadReadOnly(opts Options) error {
	return l.view(func(tx *bolt.Tx) error {
		m, err := readMeta(tx)
		if err != nil {
			return fmt.Errorf("open ledger %s: %w", l.path, err)
		}
		switch {
		case m.SchemaVersion == 0:
			return fmt.Errorf("open ledger %s: %w: the file has no caa meta bucket", l.path, ErrNotLedger)
		case m.SchemaVersion > currentSchema && compatOf(tx, m.SchemaVersion) > currentSchema:
			return fmt.Errorf("open ledger %s: %w: schema %d is newer than this caa reads (%d); use the caa version that wrote it",
				l.path, ErrSchema, m.SchemaVersion, currentSchema)
		case m.SchemaVersion < currentSchema:
			return fmt.Errorf("open ledger %s: %w: schema %d is older than this caa reads (%d); a writable open (`caa run`) migrates it",
				l.path, ErrSchema, m.SchemaVersion, currentSchema)
		}
		if err := checkOwner(l.path, m, opts.Node, opts.Cluster); err != nil {
			return err
		}
		l.meta = m
		return nil
	})
}

// checkOwner refuses a ledger written for another node or cluster, with
// advice that fits the mismatch: a node mismatch is a wrong file or node
// name, a cluster mismatch (same node) a cluster id that changed.
func checkOwner(path string, m Meta, node, cluster string) error {
	nodeDiffers := node != "" && m.Node != node
	clusterDiffers := cluster != "" && m.Cluster != cluster
	switch {
	case nodeDiffers:
		also := ""
		if clusterDiffers {
			also = fmt.Sprintf(" (and for cluster id %q, not %q)", m.Cluster, cluster)
		}
		return fmt.Errorf("open ledger %s: %w: it was written for node %q, not node %q%s; "+
			"a ledger never moves between nodes: check the hostPath and NODE_NAME, or move the file aside",
			path, ErrWrongLedger, m.Node, node, also)
	case clusterDiffers:
		return fmt.Errorf("open ledger %s: %w: it was written on node %q for cluster id %q, and caa now runs with cluster id %q; "+
			"if this is the same cluster, run caa with --cluster-id %s (env CAA_CLUSTER_ID): without it caa takes the UID of "+
			"the kube-system namespace, which changes when that namespace or the cluster is recreated; "+
			"if the file is from another cluster, move it aside",
			path, ErrWrongLedger, m.Node, m.Cluster, cluster, m.Cluster)
	}
	return nil
}

func isEmpty(tx *bolt.Tx) bool {
	empty := true
	_ = tx.ForEach(func([]byte, *bolt.Bucket) error {
		empty = false
		return errStop
	})
	return empty
}

var errStop = errors.New("stop")

func putAll(b *bolt.Bucket, kv ...[]byte) error {
	for i := 0; i+1 < len(kv); i += 2 {
		if err := b.Put(kv[i], kv[i+1]); err != nil {
			return fmt.Errorf("write meta %s: %w", kv[i], err)
		}
	}
	return nil
}

// readMeta returns a zero Meta (schema 0) for a file with no meta bucket.
func readMeta(tx *bolt.Tx) (Meta, error) {
	var m Meta
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return m, nil
	}
	if v := b.Get(keySchema); len(v) == 4 {
		m.SchemaVersion = int(binary.BigEndian.Uint32(v))
	} else {
		return m, fmt.Errorf("%w: meta/schema is %d bytes, want 4", ErrCorrupt, len(v))
	}
	m.ID = string(b.Get(keyID))
	m.Node = string(b.Get(keyNode))
	m.Cluster = string(b.Get(keyCluster))
	if v := b.Get(keyEpoch); len(v) == 8 {
		m.OpenEpoch = binary.BigEndian.Uint64(v)
	}
	if v := b.Get(keyHolderPID); v != nil {
		m.HolderPID, _ = strconv.Atoi(string(v))
	}
	m.Preflight = string(b.Get(keyPreflight))
	var err error
	if m.CreatedAt, err = parseMetaTime(b, keyCreatedAt); err != nil {
		return m, err
	}
	if m.OpenedAt, err = parseMetaTime(b, keyOpenedAt); err != nil {
		return m, err
	}
	return m, nil
}

func parseMetaTime(b *bolt.Bucket, key []byte) (time.Time, error) {
	v := b.Get(key)
	if v == nil {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, string(v))
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: meta/%s: %v", ErrCorrupt, key, err)
	}
	return t, nil
}

func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new ledger id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Path is the ledger file's path.
func (l *Ledger) Path() string { return l.path }

// Meta is the ledger's meta as read at open.
func (l *Ledger) Meta() Meta { return l.meta }

// ReadOnly reports whether the ledger was opened read-only.
func (l *Ledger) ReadOnly() bool { return l.readOnly }

// Close releases the file. It is safe to call more than once.
func (l *Ledger) Close() error {
	l.closeOnce.Do(func() {
		if !l.readOnly {
			removeHolder(l.holderPath(), os.Getpid())
		}
		if err := l.db.Close(); err != nil {
			l.closeErr = fmt.Errorf("close ledger %s: %w", l.path, err)
			return
		}
		l.log.Info("ledger closed")
	})
	return l.closeErr
}

// View runs fn in a read-only transaction.
func (l *Ledger) View(fn func(*Tx) error) error {
	return l.view(func(btx *bolt.Tx) error {
		return fn(&Tx{tx: btx, l: l, now: l.now().UTC()})
	})
}

// Update runs fn in a read-write transaction, committed (and fsynced) when
// fn returns nil and rolled back otherwise.
func (l *Ledger) Update(fn func(*Tx) error) error {
	if l.readOnly {
		return fmt.Errorf("ledger %s: %w", l.path, ErrReadOnly)
	}
	return l.update(func(btx *bolt.Tx) error {
		return fn(&Tx{tx: btx, l: l, now: l.now().UTC()})
	})
}

func (l *Ledger) view(fn func(*bolt.Tx) error) error {
	return guard(func() error { return l.db.View(fn) })
}

// batch is update for a write that may share its transaction, and so its
// commit's fsyncs, with the writes other goroutines make at the same moment
// (bbolt's Batch): kata stops or starts a node's sandboxes side by side,
// and each commit alone is the slowest part of their calls. fn may run more
// than once (a shared transaction another write failed is rolled back and
// run again without it; the failed one runs again alone, here, under
// guard), so it must act only on its transaction. It runs on whichever
// goroutine commits the batch, so it sets its own fault guard.
func (l *Ledger) batch(fn func(*Tx) error) error {
	if l.readOnly {
		return fmt.Errorf("ledger %s: %w", l.path, ErrReadOnly)
	}
	return l.noSpace(guard(func() error {
		return l.db.Batch(func(btx *bolt.Tx) error {
			defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
			return fn(&Tx{tx: btx, l: l, now: l.now().UTC()})
		})
	}))
}

// update runs fn in a write transaction; a commit the file system refuses
// for lack of space comes back as ErrNoSpace, naming where to make room.
func (l *Ledger) update(fn func(*bolt.Tx) error) error {
	return l.noSpace(guard(func() error { return l.db.Update(fn) }))
}

// guard turns a panic or a memory fault inside bbolt (which trusts its
// pages) into ErrCorrupt, so a damaged file is reported, never a crash.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrCorrupt, r)
		}
	}()
	return fn()
}

// Holder is what the holder file says about the process with the lock.
type Holder struct {
	PID      int       `json:"pid"`
	Epoch    uint64    `json:"epoch"`
	OpenedAt time.Time `json:"openedAt"`
}

func (l *Ledger) holderPath() string { return HolderPath(l.path) }

// HolderPath is where a writable open records its pid for path.
func HolderPath(path string) string { return path + ".holder" }

func writeHolder(path string, h Holder) error {
	data, err := json.Marshal(h)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, fileMode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func removeHolder(path string, pid int) {
	if h, err := ReadHolder(path); err == nil && h.PID == pid {
		_ = os.Remove(path)
	}
}

// ReadHolder reads the holder file beside a ledger.
func ReadHolder(path string) (Holder, error) {
	var h Holder
	data, err := os.ReadFile(path)
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return h, fmt.Errorf("holder file %s: %w", path, err)
	}
	return h, nil
}

func describeHolder(path string) string {
	h, err := ReadHolder(path)
	if err != nil {
		return "another process"
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(h.PID))); err == nil {
		return fmt.Sprintf("process %d (writable open at %s, epoch %d)", h.PID, h.OpenedAt.Format(time.RFC3339), h.Epoch)
	}
	return fmt.Sprintf("another process (the last recorded holder, pid %d, is not visible here: it may run in another container's pid namespace)", h.PID)
}

// Free reports whether no process holds the ledger at path open for
// writing at this moment: a hint for work worth starting early, never a
// lock (another process may take it the moment after). A ledger that does
// not exist yet is free.
func Free(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	defer func() { _ = f.Close() }()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return false
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return true
}
