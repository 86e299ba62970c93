package nodeagent

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// Two caa pods of one node, as a surge update runs them (the old one and
// the new one beside it), run at once: each its own process, health port
// and pod name, and both see the node's one host directory for their
// hostPath volume, the directory the ledger and its sockets live in.
// Deleting one leaves the other running.
func TestTwoPodsOfOneNodeShareTheHostPath(t *testing.T) {
	t.Parallel()
	const ledgerDir = "/var/lib/caa"
	surgePod := func(name string) *corev1.Pod {
		pod := fakePod(t, name, func(c *corev1.Container) {
			c.ReadinessProbe = probeOn("/readyz", 1)
			c.Env = append(c.Env,
				corev1.EnvVar{Name: fakeSharedEnv, Value: ledgerDir},
				corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
			c.VolumeMounts = []corev1.VolumeMount{{Name: "ledger", MountPath: ledgerDir}}
		})
		typ := corev1.HostPathDirectoryOrCreate
		pod.Spec.Volumes = []corev1.Volume{{Name: "ledger", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: ledgerDir, Type: &typ}}}}
		return pod
	}
	old, surge := surgePod("caa-old"), surgePod("caa-new")
	require.Equal(t, old.Spec.NodeName, surge.Spec.NodeName)
	h := startAgent(t, old, 0, surge)

	ready := h.waitForKind(Ready, 2)
	byPod := map[string]Observation{}
	for _, o := range ready {
		byPod[o.Pod.Name] = o
	}
	require.Len(t, byPod, 2, "both pods turned ready: %v", ready)
	a, b := byPod["caa-old"], byPod["caa-new"]
	assert.NotEqual(t, a.PID, b.PID, "a process each")
	assert.NotEqual(t, a.HealthURL, b.HealthURL, "a health port each")
	for _, o := range []Observation{a, b} {
		resp, err := http.Get(o.HealthURL + "/readyz")
		if assert.NoError(t, err, "%s answers", o.Pod.Name) {
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, "%s answers", o.Pod.Name)
		}
	}

	// One host directory for both, holding what each wrote under its own
	// pod name (from the downward API).
	dir := h.agent.HostDir(old.Spec.NodeName, ledgerDir)
	for _, o := range []Observation{a, b} {
		content, err := os.ReadFile(filepath.Join(dir, o.Pod.Name))
		if assert.NoError(t, err, "%s wrote into the node's host directory", o.Pod.Name) {
			assert.Equal(t, o.Pod.Name+" "+strconv.Itoa(o.PID)+"\n", string(content))
		}
	}

	// The old pod's deletion stops its process only.
	h.markDeleted(1)
	h.waitForKind(Deleted, 1)
	terms := h.observed(Terminated)
	require.Len(t, terms, 1)
	assert.Equal(t, a.PID, terms[0].PID, "the old pod's process was stopped")
	resp, err := http.Get(b.HealthURL + "/readyz")
	if assert.NoError(t, err, "the new pod's process still answers") {
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.Empty(t, h.observed(Exited, Restarted))
	assert.Empty(t, h.agent.Errors())
}
