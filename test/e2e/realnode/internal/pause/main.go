// Command pause is the sandbox ("pause") container of the real node's
// pods, built into a local image by test/e2e/realnode (there is no
// registry here to pull registry.k8s.io/pause from). Like the real one it
// holds the pod's namespaces open doing nothing, reaps the zombies it
// inherits as the pod's init, and exits 0 on SIGINT or SIGTERM.
//
// The tests' containers run it too: `pause -greet TEXT` prints TEXT first
// (what the container's log must show), and `pause echo ARGS...` prints its
// arguments and exits (what an exec into it must show).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "echo" {
		fmt.Println(strings.Join(os.Args[2:], " "))
		return
	}
	if len(os.Args) > 2 && os.Args[1] == "-greet" {
		fmt.Println(os.Args[2])
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
