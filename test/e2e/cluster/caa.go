package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/caa-project/caa/internal/logbuf"
)

// caaPackage is the main package the tests, the demo and the benchmarks run.
const caaPackage = "github.com/caa-project/caa/cmd/caa"

// BuildCaa builds the caa binary into out with `go build`, stamped with
// version when it is not empty, and with only the clouds named in tags
// (the caa_aws, caa_azure, caa_ibmcloud build tags; none: every cloud).
// The go command's output goes to this process's stderr.
func BuildCaa(ctx context.Context, out, version string, tags ...string) error {
	args := []string{"build", "-trimpath"}
	if version != "" {
		args = append(args, "-ldflags", "-X main.version="+version)
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", out, caaPackage)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build caa (%s): %w", shellJoin(args), err)
	}
	return nil
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// SyncBuffer collects a process's output while a test reads it.
type SyncBuffer = logbuf.Buffer
