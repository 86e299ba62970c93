// Command imagebuild writes caa's container image for one cloud as an OCI
// image tarball, without a container engine: the static binary `make
// static CLOUDS=<cloud>` built, a root filesystem of a user and /tmp, a
// non-root default user, and labels saying which version, source and cloud
// it holds. `make image` runs it once per cloud. The tarball loads with
// `docker load` or `podman load` and pushes with crane.
//
// It reads the binary's build information first and refuses one that is not
// the static one-cloud build the image says it holds.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
)

func main() {
	var o Options
	flag.StringVar(&o.Binary, "binary", "", "the caa binary `make static CLOUDS=<cloud>` built")
	flag.StringVar(&o.Cloud, "cloud", "", "the one cloud the binary holds: aws, azure or ibmcloud")
	flag.StringVar(&o.Version, "version", "", "caa's version, as stamped into the binary (make's VERSION)")
	flag.StringVar(&o.Repo, "repo", "caa", "the image repository; the tag is <version>-<cloud>")
	flag.StringVar(&o.Source, "source", DefaultSource, "the source repository's URL (label org.opencontainers.image.source)")
	flag.StringVar(&o.Revision, "revision", "", "the source commit (label org.opencontainers.image.revision; empty: none)")
	flag.StringVar(&o.Out, "out", "", "the tarball to write")
	flag.Parse()
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		sec, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "imagebuild: SOURCE_DATE_EPOCH=%q: want seconds since 1970 (%v)\n", epoch, err)
			os.Exit(2)
		}
		o.Created = time.Unix(sec, 0).UTC()
	}
	img, err := Write(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
	slog.Info("image written", "file", o.Out, "tag", img.Tag, "digest", img.Digest)
}
