package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/pkg/holder"
)

// TestRolloutTimeLimitsAgree reads every shipped kustomization (alone and
// with the no-surge component), takes each setting from its ConfigMap or,
// where the ConfigMap leaves it out, from `caa run --help`'s defaults, and
// checks the inequalities of docs/design.md's table of a rollout's time
// limits (holder.Limits.Check, the same check caa runs at start).
func TestRolloutTimeLimitsAgree(t *testing.T) {
	needBinaries(t)
	defaults := helpDefaults(t, repoCaa(t, ""))
	bin := kubectl(t)
	for _, k := range kustomizations {
		for _, variant := range []string{"", "components/no-surge"} {
			name := k
			raw := render(t, bin, k)
			if variant != "" {
				name += "+" + variant
				raw = withComponent(t, bin, k, variant)
			}
			t.Run(name, func(t *testing.T) {
				m := manifests{name: name, all: decode(t, raw)}
				l := shippedLimits(t, m.daemonSet(t), m.configMap(t), defaults)
				t.Logf("%+v", l)
				require.NoError(t, l.Check())
			})
		}
	}
}

// helpDefaults maps each CAA_* variable of `caa run --help` to the default
// its flag shows.
func helpDefaults(t *testing.T, bin string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", "--help")
	cmd.Env = []string{"HOME=/nonexistent"} // no CAA_* of the test's environment
	help, err := cmd.CombinedOutput()
	require.NoError(t, err, "caa run --help:\n%s", help)
	out := map[string]string{}
	line := regexp.MustCompile(`\(env (CAA_[A-Z0-9_]+)[^)]*\).*\(default ([^)]+)\)`)
	for _, m := range line.FindAllStringSubmatch(string(help), -1) {
		out[m[1]] = m[2]
	}
	require.Contains(t, out, "CAA_BOOT_TIMEOUT", "the help shows defaults:\n%s", help)
	return out
}

func shippedLimits(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap, defaults map[string]string) holder.Limits {
	t.Helper()
	setting := func(key string) string {
		if v, ok := cm.Data[key]; ok {
			return v
		}
		v, ok := defaults[key]
		require.True(t, ok, "%s is neither in the ConfigMap nor a flag default", key)
		return v
	}
	dur := func(key string) time.Duration {
		d, err := time.ParseDuration(setting(key))
		require.NoError(t, err, key)
		return d
	}
	c := container(t, ds)
	window := func(p *corev1.Probe) time.Duration {
		require.NotNil(t, p)
		return time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second
	}
	surge := false
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
		if ru.MaxSurge.Type == intstr.String {
			surge = ru.MaxSurge.StrVal != "0%" && ru.MaxSurge.StrVal != "0"
		} else {
			surge = ru.MaxSurge.IntVal > 0
		}
	}
	handover, err := strconv.ParseBool(setting("CAA_HANDOVER"))
	require.NoError(t, err)
	require.NotNil(t, ds.Spec.Template.Spec.TerminationGracePeriodSeconds)
	return holder.Limits{
		Handover: handover, Surge: surge,
		ShutdownGrace: dur("CAA_SHUTDOWN_GRACE"), BootTimeout: dur("CAA_BOOT_TIMEOUT"),
		ReadyTimeout: dur("CAA_HANDOVER_READY_TIMEOUT"), FailedCooldown: dur("CAA_HANDOVER_FAILED_COOLDOWN"),
		Stale:            3 * dur("CAA_RESYNC"),
		TerminationGrace: time.Duration(*ds.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second,
		StartupWindow:    window(c.StartupProbe), LivenessWindow: window(c.LivenessProbe),
	}
}

// TestBaseTimeLimitsAgree is the same check on the base's own files, read
// as they are (no kustomize, no build): deploy/base/daemonset.yaml, and
// config.env with the flag defaults of pkg/holder for what it leaves out.
// It runs in -short too.
func TestBaseTimeLimitsAgree(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("base", "daemonset.yaml"))
	require.NoError(t, err)
	var ds appsv1.DaemonSet
	require.NoError(t, yaml.Unmarshal(raw, &ds))
	env, err := os.ReadFile(filepath.Join("base", "config.env"))
	require.NoError(t, err)
	cm := &corev1.ConfigMap{Data: map[string]string{}}
	for _, line := range strings.Split(string(env), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
			cm.Data[k] = v
		}
	}
	defaults := map[string]string{
		"CAA_HANDOVER_READY_TIMEOUT":   holder.DefaultReadyTimeout.String(),
		"CAA_HANDOVER_FAILED_COOLDOWN": holder.DefaultFailedCooldown.String(),
	}
	l := shippedLimits(t, &ds, cm, defaults)
	require.NoError(t, l.Check())
}
