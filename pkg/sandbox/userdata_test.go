package sandbox

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/podvm"
)

const initDoc = "algorithm = \"sha256\"\nversion = \"0.1.0\"\n\n[data]\n\"aa.toml\" = '''\n[token_configs]\n'''\n"

// encodeAnnotation is the pod annotation's form: gzip, then base64.
func encodeAnnotation(t *testing.T, doc string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	_, err := gz.Write([]byte(doc))
	require.NoError(t, err)
	require.NoError(t, gz.Close())
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

func (f *fakeSide) lastUserData(t *testing.T) UserDataInput {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.userData)
	return f.userData[len(f.userData)-1]
}

// kata's shim decodes the pod's cc_init_data annotation and sends the
// document with CreateVM. After a caa restart that copy is gone and caa
// reads the pod's annotation, still gzip+base64: it must decode it, so that
// the VM gets the document encoded once, not the encoding encoded again.
func TestStartVMAfterRestartCarriesInitDataEncodedOnce(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	p := r.pod("uid-1", "web")
	p.Annotations[AnnotationInitData] = encodeAnnotation(t, initDoc)
	a := shimAnnotations("web")
	a[AnnotationInitData] = initDoc // what the shim sends: the decoded document
	_, err := r.m.CreateVM(ctx, sbA, a, "/run/netns/ns")
	require.NoError(t, err)

	r.crash()
	r.start()
	require.NoError(t, r.m.StartVM(ctx, sbA))
	got := r.side.lastUserData(t).InitData
	assert.Equal(t, initDoc, got, "the VM's initdata is the document, decoded from the pod's annotation")

}

func TestInitDataSourcesAndErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("the shim's document is used as sent", func(t *testing.T) {
		r := newRig(t)
		r.pod("uid-1", "web")
		a := shimAnnotations("web")
		a[AnnotationInitData] = initDoc
		_, err := r.m.CreateVM(ctx, sbA, a, "/run/netns/ns")
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, sbA))
		assert.Equal(t, initDoc, r.side.lastUserData(t).InitData)
	})
	t.Run("the cluster default, for a pod that names none, in either form", func(t *testing.T) {
		for _, def := range []string{initDoc, encodeAnnotation(t, initDoc)} {
			r := newRig(t)
			r.crash()
			r.tweak = func(c *Config) { c.DefaultInitData = def }
			r.start()
			r.pod("uid-1", "web")
			_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
			require.NoError(t, err)
			require.NoError(t, r.m.StartVM(ctx, sbA))
			assert.Equal(t, initDoc, r.side.lastUserData(t).InitData)
		}
	})
	t.Run("the pod's own initdata wins over the default", func(t *testing.T) {
		r := newRig(t)
		r.crash()
		r.tweak = func(c *Config) { c.DefaultInitData = "algorithm = \"sha384\"\n" }
		r.start()
		r.pod("uid-1", "web")
		a := shimAnnotations("web")
		a[AnnotationInitData] = initDoc
		_, err := r.m.CreateVM(ctx, sbA, a, "/run/netns/ns")
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, sbA))
		assert.Equal(t, initDoc, r.side.lastUserData(t).InitData)
	})
	t.Run("user data over the cloud's cap even without credentials fails the sandbox, with the sizes", func(t *testing.T) {
		r := newRig(t)
		r.crash()
		r.tweak = func(c *Config) {
			c.PullSecrets = &fakePullSecrets{auth: []byte(`{"auths":{"r":{"auth":"dXNlcjpodW50ZXIy"}}}`)}
			c.Spec.UserDataLimit = len(initDoc) // the document alone fits, not with the rest
		}
		r.start()
		r.pod("uid-1", "web")
		a := shimAnnotations("web")
		a[AnnotationInitData] = initDoc
		_, err := r.m.CreateVM(ctx, sbA, a, "/run/netns/ns")
		require.NoError(t, err)
		err = r.m.StartVM(ctx, sbA)
		require.ErrorIs(t, err, ErrNotStartable)
		assert.ErrorContains(t, err, fmt.Sprintf("its initdata %d bytes), over the cloud's %d-byte cap, even without image-pull credentials", len(initDoc), len(initDoc)))
		assert.Equal(t, ledger.SandboxFailed, r.sandbox(sbA).Phase)
		assert.Empty(t, r.live(), "no VM was made")
		assert.Contains(t, r.events.reasons(), EventPullSecrets, "the credentials went first, said so")
	})
	t.Run("a pod annotation that is not gzip in base64 fails the sandbox, named", func(t *testing.T) {
		r := newRig(t)
		p := r.pod("uid-1", "web")
		p.Annotations[AnnotationInitData] = "H4sIbroken!!"
		_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
		require.NoError(t, err)
		err = r.m.StartVM(ctx, sbA)
		require.ErrorIs(t, err, ErrNotStartable)
		assert.Contains(t, err.Error(), "pod team/web's annotation "+AnnotationInitData)
		assert.Equal(t, ledger.SandboxFailed, r.sandbox(sbA).Phase)
		assert.Empty(t, r.live(), "no VM was made")
	})
}

// fakePullSecrets counts its calls and answers one auth file.
type fakePullSecrets struct {
	mu    sync.Mutex
	calls []string
	auth  []byte
	err   error
}

func (f *fakePullSecrets) AuthJSON(_ context.Context, ns, name, uid string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, ns+"/"+name+"/"+uid)
	return bytes.Clone(f.auth), f.err
}

func TestImagePullCredentialsReachTheVMOnly(t *testing.T) {
	ctx := context.Background()
	secret := `{"auths":{"registry.example":{"auth":"dXNlcjpodW50ZXIy"}}}`
	start := func(t *testing.T, ps *fakePullSecrets) *rig {
		r := newRig(t)
		r.crash()
		r.tweak = func(c *Config) { c.PullSecrets = ps }
		r.start()
		r.pod("uid-1", "web")
		_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, sbA), "credentials never fail a sandbox")
		return r
	}
	t.Run("carried to the user data, not to the ledger", func(t *testing.T) {
		ps := &fakePullSecrets{auth: []byte(secret)}
		r := start(t, ps)
		assert.Equal(t, []string{"team/web/uid-1"}, ps.calls)
		assert.JSONEq(t, secret, string(r.side.lastUserData(t).AuthJSON))
		hist, err := r.led.SandboxHistory(sbA)
		require.NoError(t, err)
		for _, h := range hist {
			b, err := json.Marshal(h)
			require.NoError(t, err)
			assert.NotContains(t, string(b), "dXNlcjpodW50ZXIy", "no credential in the ledger")
		}
	})
	t.Run("over 12 KiB: left out, with a warning event", func(t *testing.T) {
		big := `{"auths":{"r":{"auth":"` + strings.Repeat("A", podvm.MaxAuthJSON) + `"}}}`
		r := start(t, &fakePullSecrets{auth: []byte(big)})
		assert.Nil(t, r.side.lastUserData(t).AuthJSON)
		assert.Contains(t, r.events.reasons(), EventPullSecrets)
	})
	t.Run("over the cloud's cap on user data with them: left out, with a warning event", func(t *testing.T) {
		r := newRig(t)
		r.crash()
		r.tweak = func(c *Config) {
			c.PullSecrets = &fakePullSecrets{auth: []byte(secret)}
			c.Spec.UserDataLimit = 80 // the user data's own part fits, not with the credentials
		}
		r.start()
		r.pod("uid-1", "web")
		_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, sbA))
		assert.Nil(t, r.side.lastUserData(t).AuthJSON)
		require.Len(t, r.live(), 1)
		assert.NotContains(t, string(r.live()[0].UserData()), "dXNlcjpodW50ZXIy")
		assert.Contains(t, r.events.reasons(), EventPullSecrets)
		assert.Contains(t, r.events.messages(), "over the cloud's 80-byte cap")
	})
	t.Run("unreadable: left out, with a warning event", func(t *testing.T) {
		r := start(t, &fakePullSecrets{err: errors.New("forbidden")})
		assert.Nil(t, r.side.lastUserData(t).AuthJSON)
		assert.Contains(t, r.events.reasons(), EventPullSecrets)
	})
}

func TestKubePullSecretsMergesServiceAccountAndPodSecrets(t *testing.T) {
	dcj := func(m string) map[string][]byte { return map[string][]byte{corev1.DockerConfigJsonKey: []byte(m)} }
	client := kubefake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", UID: types.UID("uid-1")},
			Spec: corev1.PodSpec{ServiceAccountName: "builder", ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pod-secret"}, {Name: "missing"}}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "builder"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "sa-secret"}, {Name: "old-cfg"}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "sa-secret"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: dcj(`{"auths":{"shared.example":{"auth":"c2E6c2E="},"sa.example":{"username":"u","password":"p"}}}`)},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "old-cfg"}, Type: corev1.SecretTypeDockercfg,
			Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"cfg.example":{"auth":"Y2ZnOmNmZw=="},"empty.example":{}}`)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "pod-secret"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: dcj(`{"auths":{"shared.example":{"auth":"cG9kOnBvZA=="}}}`)},
	)
	ks := KubePullSecrets{Client: client}
	got, err := ks.AuthJSON(context.Background(), "team", "web", "uid-1")
	require.NoError(t, err)
	assert.JSONEq(t, `{"auths":{
		"shared.example":{"auth":"cG9kOnBvZA=="},
		"sa.example":{"auth":"dTpw"},
		"cfg.example":{"auth":"Y2ZnOmNmZw=="}}}`, string(got), "the pod's secret wins; user:password becomes auth; an empty entry is skipped")

	_, err = ks.AuthJSON(context.Background(), "team", "web", "uid-2")
	require.Error(t, err, "a newer pod of the same name is not the sandbox's")

	none, err := KubePullSecrets{Client: kubefake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "plain"}})}.
		AuthJSON(context.Background(), "team", "plain", "")
	require.NoError(t, err, "no service account object: only the pod's secrets count")
	assert.Nil(t, none)
}

// TestKubePullSecretsAsNodeReadsWhatTheKubeletReads: with the node's
// identity caa reads the pod and the secrets it names, and never a service
// account (the Node authorizer refuses every read of one).
func TestKubePullSecretsAsNodeReadsWhatTheKubeletReads(t *testing.T) {
	client := kubefake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", UID: types.UID("uid-1")},
			Spec: corev1.PodSpec{ServiceAccountName: "builder", ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pod-secret"}}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "builder"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "sa-secret"}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "sa-secret"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"sa.example":{"auth":"c2E6c2E="}}}`)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "pod-secret"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"pod.example":{"auth":"cG9kOnBvZA=="}}}`)}},
	)
	client.PrependReactor("get", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("serviceaccounts"), "builder", errors.New("nodes read no service account"))
	})
	got, err := KubePullSecrets{Client: client, AsNode: true}.AuthJSON(context.Background(), "team", "web", "uid-1")
	require.NoError(t, err)
	assert.JSONEq(t, `{"auths":{"pod.example":{"auth":"cG9kOnBvZA=="}}}`, string(got))
	for _, a := range client.Actions() {
		assert.NotEqual(t, "serviceaccounts", a.GetResource().Resource, "read as the node: %v", a)
	}
}
