package nodeagent

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// errImage marks a pod whose image tag has no binary: the kubelet's
// ErrImagePull.
var errImage = errors.New("image")

const (
	// healthEnv is caa's health listen address; caaDefaultHealthPort is
	// the port it listens on when the variable is unset.
	healthEnv            = "CAA_HEALTH_ADDR"
	caaDefaultHealthPort = 8000
	// unixPrefix marks a health address that is a unix socket's path.
	unixPrefix = "unix:"
)

// imageTag returns the tag of an image reference ("latest" when it names
// none); a reference by digest has no tag the agent can map.
func imageTag(image string) (string, error) {
	if strings.Contains(image, "@") {
		return "", fmt.Errorf("%w: %s is pinned by digest; the agent maps tags only", errImage, image)
	}
	name := image[strings.LastIndex(image, "/")+1:]
	if i := strings.LastIndex(name, ":"); i >= 0 {
		return name[i+1:], nil
	}
	return "latest", nil
}

// mount is a container mount resolved to a directory on this machine.
type mount struct {
	path string // inside the "container"
	host string
}

// mounts resolves c's volume mounts. A hostPath volume maps to
// <dir>/<node>/<path>, so every pod on a node (old and new caa alike) sees
// the same directory, as with a real hostPath; an emptyDir is the pod's
// own. Projected and other volumes are not mounted (caa's API credentials
// come in a kubeconfig instead).
func mounts(pod *corev1.Pod, c *corev1.Container, dir, podDir string) ([]mount, error) {
	hostDirs := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			host := filepath.Join(dir, pod.Spec.NodeName, filepath.Clean("/"+v.HostPath.Path))
			typ := corev1.HostPathUnset
			if v.HostPath.Type != nil {
				typ = *v.HostPath.Type
			}
			switch typ {
			case corev1.HostPathDirectoryOrCreate:
				if err := os.MkdirAll(host, 0o755); err != nil {
					return nil, fmt.Errorf("%w: hostPath volume %s: %w", errConfig, v.Name, err)
				}
			case corev1.HostPathDirectory, corev1.HostPathUnset:
				if info, err := os.Stat(host); err != nil || !info.IsDir() {
					return nil, fmt.Errorf("%w: hostPath volume %s: %s is not a directory", errConfig, v.Name, host)
				}
			case corev1.HostPathFile:
				// The node's own file (the kubelet's kubeconfig): the test
				// puts it at HostDir first, as the node has it.
				if info, err := os.Stat(host); err != nil || !info.Mode().IsRegular() {
					return nil, fmt.Errorf("%w: hostPath volume %s: %s is not a file", errConfig, v.Name, host)
				}
			default:
				return nil, fmt.Errorf("%w: hostPath volume %s: type %s is not supported", errConfig, v.Name, typ)
			}
			hostDirs[v.Name] = host
		case v.EmptyDir != nil:
			host := filepath.Join(podDir, "volumes", v.Name)
			if err := os.MkdirAll(host, 0o755); err != nil {
				return nil, fmt.Errorf("%w: emptyDir volume %s: %w", errConfig, v.Name, err)
			}
			hostDirs[v.Name] = host
		}
	}
	var out []mount
	for _, m := range c.VolumeMounts {
		host, ok := hostDirs[m.Name]
		if !ok {
			continue
		}
		out = append(out, mount{path: filepath.Clean(m.MountPath), host: filepath.Join(host, m.SubPath)})
	}
	// Longest first, so a nested mount wins over its parent.
	slices.SortFunc(out, func(a, b mount) int { return len(b.path) - len(a.path) })
	return out, nil
}

// hostPath maps an absolute path inside the container onto this machine
// through the mounts; anything else is returned as is.
func hostPath(p string, ms []mount) string {
	if !strings.HasPrefix(p, "/") {
		return p
	}
	for _, m := range ms {
		if p == m.path {
			return m.host
		}
		if rest, ok := strings.CutPrefix(p, m.path+"/"); ok {
			return filepath.Join(m.host, rest)
		}
	}
	return p
}

// hostArg maps a path argument ("/x" or "--flag=/x") through the mounts.
func hostArg(a string, ms []mount) string {
	if flag, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(flag, "-") {
		return flag + "=" + hostPath(value, ms)
	}
	return hostPath(a, ms)
}

// launch is how to run a pod's container here.
type launch struct {
	binary string
	args   []string
	env    []string
	// healthPort is the container port caa's health address names;
	// localPort is the loopback port it really listens on.
	healthPort int32
	localPort  int
	// dir is the process's working directory (the pod's directory).
	dir string
}

// shortenHealthSocket makes a unix health address under the pod's
// directory relative to it (the process runs there): the pod's path here
// would not fit a unix socket address, while in a real container it is
// short (/run/caa/health.sock).
func (l *launch) shortenHealthSocket() {
	for i, kv := range l.env {
		v, ok := strings.CutPrefix(kv, healthEnv+"="+unixPrefix)
		if !ok {
			continue
		}
		if rel, err := filepath.Rel(l.dir, v); err == nil && !strings.HasPrefix(rel, "..") {
			l.env[i] = healthEnv + "=" + unixPrefix + rel
		}
	}
}

// healthContainerPort is the port of caa's health address as the pod
// spec sets it (":8000" gives 8000), or caa's default.
func healthContainerPort(e *env) (int32, error) {
	addr, ok := e.get(healthEnv)
	if !ok || addr == "" {
		return caaDefaultHealthPort, nil
	}
	if strings.HasPrefix(addr, unixPrefix) {
		return 0, nil // a unix socket: exec probes, no port
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q: %w", errConfig, healthEnv, addr, err)
	}
	n, err := strconv.ParseInt(port, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q: port: %w", errConfig, healthEnv, addr, err)
	}
	return int32(n), nil
}

// buildLaunch turns the resolved environment and mounts into a process:
// the binary for the image's tag in place of the image's entrypoint, the
// container's command arguments and args expanded and mapped, path values
// under a mount mapped onto this machine, the health address moved to a
// loopback port, and the pod's own kubeconfig and home directory.
func buildLaunch(c *corev1.Container, binaries map[string]string, e *env, ms []mount, localPort int, kubeconfig, home string) (launch, error) {
	tag, err := imageTag(c.Image)
	if err != nil {
		return launch{}, err
	}
	bin, ok := binaries[tag]
	if !ok {
		known := slices.Sorted(maps.Keys(binaries))
		return launch{}, fmt.Errorf("%w: no binary for %s (tag %q; the agent has %v)", errImage, c.Image, tag, known)
	}
	healthPort, err := healthContainerPort(e)
	if err != nil {
		return launch{}, err
	}
	var args []string
	if len(c.Command) > 1 {
		args = append(args, c.Command[1:]...)
	}
	args = append(args, c.Args...)
	for i, a := range args {
		args[i] = hostArg(expand(a, e.get), ms)
	}
	out := newEnv()
	for _, n := range e.names {
		out.set(n, hostPath(e.values[n], ms))
	}
	if addr, _ := e.get(healthEnv); strings.HasPrefix(addr, unixPrefix) {
		// The socket's path, mapped like any path (the pod's emptyDir).
		out.set(healthEnv, unixPrefix+hostPath(strings.TrimPrefix(addr, unixPrefix), ms))
	} else {
		out.set(healthEnv, net.JoinHostPort(podIP, strconv.Itoa(localPort)))
	}
	out.set("KUBECONFIG", kubeconfig)
	out.set("HOME", home)
	if _, ok := out.get("PATH"); !ok {
		out.set("PATH", "/usr/local/bin:/usr/bin:/bin")
	}
	return launch{binary: bin, args: args, env: out.list(), healthPort: healthPort, localPort: localPort}, nil
}

// probeURL is where an httpGet probe lands: the health port is served on
// the loopback port; any other port has nothing behind it.
func probeURL(c *corev1.Container, p *corev1.HTTPGetAction, l launch) (string, error) {
	port := p.Port.IntVal
	if p.Port.Type == intstr.String {
		port = 0
		for _, cp := range c.Ports {
			if cp.Name == p.Port.StrVal {
				port = cp.ContainerPort
			}
		}
		if port == 0 {
			return "", fmt.Errorf("probe port %q names no container port", p.Port.StrVal)
		}
	}
	if port != l.healthPort {
		return "", fmt.Errorf("probe port %d: nothing listens there (caa serves health on %d)", port, l.healthPort)
	}
	path := p.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return "http://" + net.JoinHostPort(podIP, strconv.Itoa(l.localPort)) + path, nil
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
