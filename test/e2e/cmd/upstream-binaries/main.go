// Command upstream-binaries builds, or finds in the cache, the upstream
// programs tests run beside caa (test/e2e/upstream) from $UPSTREAM_SRC, and
// prints "<build> <directory>" for each. With build names (podvm, adaptor,
// kata-shim, kata-agent) it builds only those; -dir prints the directories
// alone, one a line, for a Makefile to read.
//
//	go run ./test/e2e/cmd/upstream-binaries [-dir] [build...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/caa-project/caa/test/e2e/upstream"
)

func main() {
	dirOnly := flag.Bool("dir", false, "print only the directories, one a line")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kinds := upstream.Kinds
	if flag.NArg() > 0 {
		kinds = nil
		for _, a := range flag.Args() {
			kinds = append(kinds, upstream.Kind(a))
		}
	}
	for _, k := range kinds {
		dir, err := upstream.Build(ctx, k)
		if err != nil {
			fmt.Fprintln(os.Stderr, "upstream-binaries:", err)
			os.Exit(1)
		}
		if *dirOnly {
			fmt.Println(dir)
		} else {
			fmt.Printf("%s %s\n", k, dir)
		}
	}
}
