package nodeagent

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

func testPod(c corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: "caa-x7k2p", UID: "uid-1",
			Labels: map[string]string{"app.kubernetes.io/name": "caa"}, Annotations: map[string]string{"note": "hi"}},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "caa", Containers: []corev1.Container{c}},
	}
}

func objects() *fake.Clientset {
	return fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: "caa-config"},
			Data: map[string]string{"CAA_PROVIDER": "aws", "CAA_RESYNC": "1m", "bad key": "skipped"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "caa-system", Name: "creds"},
			Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKID"), "AWS_SECRET_ACCESS_KEY": []byte("s3cret")}},
	)
}

func TestResolveEnvLikeTheKubelet(t *testing.T) {
	opt := true
	c := corev1.Container{
		Name: "caa", Image: "caa:v1",
		EnvFrom: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "caa-config"}}},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
			{Prefix: "OPT_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: &opt}},
		},
		Env: []corev1.EnvVar{
			{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "NOTE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['note']"}}},
			{Name: "CAA_RESYNC", Value: "2m"}, // env overrides envFrom
			{Name: "WHERE", Value: "$(NODE_NAME)/$(POD) $$(NODE_NAME) $(UNDEFINED)"},
			{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "AWS_ACCESS_KEY_ID"}}},
			{Name: "PROVIDER", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "caa-config"}, Key: "CAA_PROVIDER"}}},
			{Name: "MAYBE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "caa-config"}, Key: "nope", Optional: &opt}}},
		},
	}
	e, err := resolveEnv(context.Background(), objects(), testPod(c), &c)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"CAA_PROVIDER=aws", "CAA_RESYNC=2m", "AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=s3cret",
		"NODE_NAME=node-a", "POD=caa-x7k2p", "NS=caa-system", "NOTE=hi",
		"WHERE=node-a/caa-x7k2p $(NODE_NAME) $(UNDEFINED)", "KEY=AKID", "PROVIDER=aws",
	}, e.list(), "envFrom in order (invalid keys skipped), then env, a later name replacing an earlier in place")
}

func TestResolveEnvMissingRequired(t *testing.T) {
	ref := func(name string) corev1.LocalObjectReference { return corev1.LocalObjectReference{Name: name} }
	cases := map[string]corev1.Container{
		"envFrom configmap": {EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: ref("absent")}}}},
		"envFrom secret":    {EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: ref("absent")}}}},
		"configmap key": {Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: ref("caa-config"), Key: "nope"}}}}},
		"secret key": {Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: ref("creds"), Key: "nope"}}}}},
		"secret": {Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: ref("absent"), Key: "k"}}}}},
		"field path": {Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.phase"}}}}},
		"resource field": {Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := resolveEnv(context.Background(), objects(), testPod(c), &c)
			require.Error(t, err)
			assert.True(t, errors.Is(err, errConfig), "a CreateContainerConfigError: %v", err)
		})
	}
}

func TestImageTag(t *testing.T) {
	for image, want := range map[string]string{
		"caa:v1": "v1", "registry.example.com:5000/team/caa:v2.1": "v2.1", "caa": "latest", "registry:5000/caa": "latest",
	} {
		got, err := imageTag(image)
		require.NoError(t, err)
		assert.Equal(t, want, got, image)
	}
	_, err := imageTag("caa@sha256:0123")
	assert.ErrorIs(t, err, errImage)
}

func TestLaunchMapsHostPathHealthAndArgs(t *testing.T) {
	dir := t.TempDir()
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	c := corev1.Container{
		Name: "caa", Image: "registry/caa:v2", Command: []string{"/caa", "run"}, Args: []string{"--ledger=/var/lib/caa/other.db", "$(NODE_NAME)"},
		Ports:        []corev1.ContainerPort{{Name: "health", ContainerPort: 8000}},
		VolumeMounts: []corev1.VolumeMount{{Name: "ledger", MountPath: "/var/lib/caa"}},
		Env: []corev1.EnvVar{
			{Name: "NODE_NAME", Value: "node-a"},
			{Name: "CAA_HEALTH_ADDR", Value: ":8000"},
			{Name: "CAA_LEDGER", Value: "/var/lib/caa/ledger.db"},
			{Name: "UNMOUNTED", Value: "/etc/caa/x"},
		},
	}
	pod := testPod(c)
	pod.Spec.Volumes = []corev1.Volume{{Name: "ledger", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/caa", Type: &dirOrCreate}}}}
	e, err := resolveEnv(context.Background(), objects(), pod, &c)
	require.NoError(t, err)
	ms, err := mounts(pod, &c, dir, filepath.Join(dir, "pod"))
	require.NoError(t, err)
	host := filepath.Join(dir, "node-a", "var", "lib", "caa")
	assert.DirExists(t, host, "DirectoryOrCreate made the node's directory")

	l, err := buildLaunch(&c, map[string]string{"v1": "/bin/caa-v1", "v2": "/bin/caa-v2"}, e, ms, 41234, "/k/kubeconfig", "/k/home")
	require.NoError(t, err)
	assert.Equal(t, "/bin/caa-v2", l.binary, "the binary of the image's tag")
	assert.Equal(t, []string{"run", "--ledger=" + filepath.Join(host, "other.db"), "node-a"}, l.args)
	assert.Contains(t, l.env, "CAA_LEDGER="+filepath.Join(host, "ledger.db"))
	assert.Contains(t, l.env, "CAA_HEALTH_ADDR=127.0.0.1:41234")
	assert.Contains(t, l.env, "UNMOUNTED=/etc/caa/x")
	assert.Contains(t, l.env, "KUBECONFIG=/k/kubeconfig")
	assert.Equal(t, int32(8000), l.healthPort)

	byName, err := probeURL(&c, &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}, l)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:41234/readyz", byName)
	byNumber, err := probeURL(&c, &corev1.HTTPGetAction{Path: "healthz", Port: intstr.FromInt32(8000)}, l)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:41234/healthz", byNumber)
	_, err = probeURL(&c, &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(9000)}, l)
	assert.Error(t, err, "a probe of a port caa does not serve fails")

	_, err = buildLaunch(&corev1.Container{Image: "caa:v3"}, map[string]string{"v1": "/bin/caa-v1"}, e, ms, 1, "", "")
	assert.ErrorIs(t, err, errImage)
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"plain": "plain", "$(A)-$(B)": "1-two", "$$(A)": "$(A)", "$(C)": "$(C)", "$(A": "$(A", "$x$": "$x$", "a$$b": "a$b",
	} {
		assert.Equal(t, want, expand(in, lookup), in)
	}
}
