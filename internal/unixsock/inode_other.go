//go:build !linux

package unixsock

import "io/fs"

// Inode is fi's device and inode number; ok is false where the platform
// does not say (here: always).
func Inode(fs.FileInfo) (FileID, bool) { return FileID{}, false }

// lockDir takes no lock here: only Linux runs caa's daemons.
func lockDir(string, func()) (func(), error) { return func() {}, nil }
