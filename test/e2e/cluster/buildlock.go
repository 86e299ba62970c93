package cluster

import "context"

// CacheDir is the directory the e2e binaries are cached in: $CAA_E2E_CACHE
// (CacheEnv), else the user cache directory's caa-e2e. Other builders of
// test binaries (test/e2e/upstream) cache beside the control plane's.
func CacheDir() (string, error) { return cacheDir() }

// LockBuilds takes the cache's build lock, the one EnsureBinaries builds
// under, so that no two builds of any test binary share the machine's cores
// at once. waiting is called once, with the holder, when another process
// holds it.
func LockBuilds(ctx context.Context, cache string, waiting func(holder string)) (unlock func(), err error) {
	return lockFile(ctx, cache+"/build.lock", waiting)
}
