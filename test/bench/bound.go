package main

import "time"

// Pages is how many list calls it takes to see n items at size per page.
// An empty listing still costs one call.
func Pages(n, size int) int {
	if n <= 0 || size <= 0 {
		return 1
	}
	return (n + size - 1) / size
}

// WarmRestartBound is S1's floor: caa cannot be ready before its process
// has started, it has listed its node's pods, opened and scanned its
// ledger, and made its cloud calls one after another: a token where the
// cloud wants one first (auth), then the listing's pages (pages x
// latency; listings that can run side by side, as IBM's volumes and
// instances, overlap).
func WarmRestartBound(exec, podList, ledgerScan time.Duration, auth, n, pageSize int, latency time.Duration) time.Duration {
	return exec + podList + ledgerScan + time.Duration(auth+Pages(n, pageSize))*latency
}

// CreateSchedule is how long a token bucket of rate per second and burst
// takes to let n writes through: the burst at once, the rest at the rate.
func CreateSchedule(n int, rate float64, burst int) time.Duration {
	if n <= burst || rate <= 0 {
		return 0
	}
	return time.Duration(float64(n-burst) / rate * float64(time.Second))
}

// Slope fits y = a + b x by least squares and returns b.
func Slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

// SandboxRestartBound is S8's floor for serving n sandboxes again after a
// restart: the process start, the node's pod list, one listing of the
// node's VMs, the kernel's check of the surviving tunnels (measured side by
// side, as caa runs them), and the relayed agent calls: each costs call of
// CPU at both ends of its mutual-TLS connection, all on this machine's cpus,
// so n of them take at least ceil(n/cpus) calls one after another.
func SandboxRestartBound(exec, podList, listing, tunnels, call time.Duration, n, cpus int) time.Duration {
	cpus = max(cpus, 1)
	return exec + podList + listing + tunnels + time.Duration((max(n, 1)+cpus-1)/cpus)*call
}
