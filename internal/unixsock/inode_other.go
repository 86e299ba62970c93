//go:build !linux

package unixsock

import "io/fs"

// Inode is fi's device and inode number; ok is false where the platform
// does not say (here: always).
func Inode(fs.FileInfo) (FileID, bool) { return FileID{}, false }
