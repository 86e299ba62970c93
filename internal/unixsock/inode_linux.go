package unixsock

import (
	"io/fs"
	"syscall"
)

// Inode is fi's device and inode number; ok is false where the platform
// does not say.
func Inode(fi fs.FileInfo) (id FileID, ok bool) {
	if st, isStat := fi.Sys().(*syscall.Stat_t); isStat {
		return FileID{Dev: uint64(st.Dev), Ino: st.Ino}, true //nolint:unconvert // Dev's type differs by architecture
	}
	return FileID{}, false
}
