package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/pkg/nodecap"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// access is one (verb, resource) question put to the authorizer.
type access struct {
	verb, resource, namespace, name string
}

func (a access) String() string {
	return fmt.Sprintf("%s %s (namespace %q, name %q)", a.verb, a.resource, a.namespace, a.name)
}

// granted are the calls caa makes, read off the code (pkg/reconcile/kube.go
// and cmd/caa): the pod informer's list and watch across namespaces, the
// Node's ledger annotation and peer-pod capacity (its status), the
// kube-system UID, and the event recorder.
// The run below makes each of them for real; this table also covers the
// recorder's patch, which only a repeated event triggers.
var granted = []access{
	{"list", "pods", "", ""},
	{"watch", "pods", "", ""},
	{"get", "nodes", "", "worker-1"},
	{"patch", "nodes", "", "worker-1"},
	{"patch", "nodes/status", "", "worker-1"},
	{"get", "namespaces", "", "kube-system"},
	{"create", "events", "team", ""},
	{"patch", "events", "team", ""},
}

// denied are calls caa never makes; the role must not allow them.
var denied = []access{
	{"get", "pods", "team", "pod-0"},
	{"delete", "pods", "team", "pod-0"},
	{"update", "pods", "team", "pod-0"},
	{"list", "nodes", "", ""},
	{"update", "nodes", "", "worker-1"},
	{"delete", "nodes", "", "worker-1"},
	{"update", "nodes/status", "", "worker-1"},
	{"get", "namespaces", "", "default"},
	{"list", "secrets", "", ""},
	{"get", "secrets", namespace, secretName},
	{"get", "configmaps", namespace, ""},
	{"delete", "events", "team", ""},
	{"create", "pods", "team", ""},
}

// runUnderServiceAccount applies the AWS overlay for real, takes a token
// for its ServiceAccount, and runs the real caa binary with only that
// token against a fake EC2, with the settings and the Secret keys the
// overlay defines: it must converge, annotate its Node and raise an event,
// so every call it makes passed the role, and the token must be refused
// what the role leaves out.
func runUnderServiceAccount(ctx context.Context, t *testing.T, c *cluster.Cluster, kubectlBin string) {
	const node, team, peers = "worker-1", "team", 5
	// The overlay's own image: the EC2-only build.
	caaBin := repoCaa(t, providerOf["overlays/aws"])

	_, err := runKubectl(ctx, kubectlBin, render(t, kubectlBin, "overlays/aws"), "--kubeconfig", c.Kubeconfig(),
		"apply", "--server-side", "--field-manager=caa-deploy-test", "-f", "-")
	require.NoError(t, err, "apply the AWS overlay")
	// The token is bound to a caa pod on the node, as the kubelet's is:
	// the admission policies every install has (base/admission.yaml) let
	// caa's token change only the Node its token names.
	_, err = c.CreateNode(ctx, node)
	require.NoError(t, err)
	saClient, saKubeconfig := serviceAccountClient(ctx, t, c, node)

	for _, a := range granted {
		assert.True(t, allowed(ctx, t, saClient, a), "the role allows %s", a)
	}
	for _, a := range denied {
		assert.False(t, allowed(ctx, t, saClient, a), "the role refuses %s", a)
	}
	_, err = saClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the token is no admin: listing secrets is forbidden, got %v", err)

	for i := range peers {
		_, err := c.CreatePeerPod(ctx, team, fmt.Sprintf("pod-%d", i), node, nil)
		require.NoError(t, err)
	}
	// A machine type no cloud has: caa reports it on the pod as a Warning.
	_, err = c.CreatePeerPod(ctx, team, "bad", node, map[string]string{provider.AnnotationMachineType: "x99.colossal"})
	require.NoError(t, err)

	// The fake EC2 checks signatures with the key pair the Secret holds.
	env := overlayEnv(ctx, t, c)
	keys := secretExampleKeys(t, "overlays/aws")
	require.ElementsMatch(t, []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, keys)
	const keyID, secretKey = "AKIDDEPLOYTEST", "deploy-test-secret"
	env = append(env, "AWS_ACCESS_KEY_ID="+keyID, "AWS_SECRET_ACCESS_KEY="+secretKey,
		// No instance metadata or shared files: the Secret is the only source.
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE="+os.DevNull, "AWS_SHARED_CREDENTIALS_FILE="+os.DevNull,
		"NODE_NAME="+node, "KUBECONFIG="+saKubeconfig)
	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{"ami-0123456789abcdef0"}}))
	ec2 := httptest.NewServer(ec2fake.NewServer(core, ec2fake.WithCredentials(keyID, secretKey)))
	t.Cleanup(ec2.Close)

	port, err := cluster.FreePort()
	require.NoError(t, err)
	health := "127.0.0.1:" + strconv.Itoa(port)
	// Flags override the overlay's placeholders and the in-pod paths; the
	// rest (provider, log format, rates, grace) comes from the ConfigMap.
	d := startCaa(t, caaBin, env, "run", "--health-addr", health, "--ledger", filepath.Join(t.TempDir(), "caa", "ledger.db"),
		"--aws-endpoint", ec2.URL, "--aws-region", "us-east-1", "--aws-subnet-id", "subnet-0123456789abcdef0",
		"--aws-security-group-ids", "sg-0123456789abcdef0",
		"--aws-image", "ami-0123456789abcdef0", "--aws-instance-type", "m6a.large")

	waitFor(t, d, 3*time.Minute, "caa turns ready under the ServiceAccount", func() bool {
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	assert.Len(t, core.Live(), peers, "one VM per good peer pod")
	n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEmpty(t, n.Annotations[reconcile.LedgerAnnotation], "caa patched its Node")
	waitFor(t, d, time.Minute, "caa advertises the node's kata.peerpods.io/vm capacity", func() bool {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		q, ok := n.Status.Allocatable[nodecap.Resource]
		return err == nil && ok && q.Value() == nodecap.DefaultMax
	})
	waitFor(t, d, time.Minute, "caa's Warning event on the bad pod", func() bool {
		return hasEvent(ctx, t, c, team, "bad", corev1.EventTypeWarning, reconcile.EventCreateFailed)
	})
	waitFor(t, d, time.Minute, "caa's Normal event on a good pod", func() bool {
		return hasEvent(ctx, t, c, team, "pod-0", corev1.EventTypeNormal, "VMCreated")
	})
	d.stop(t)
	assert.NotContains(t, d.logs.String(), "forbidden", "no call of caa was refused")
}

// serviceAccountClient takes a token for the overlay's ServiceAccount
// through the TokenRequest API, bound to a caa pod on node as the kubelet
// would take it for the pod, and returns a client and a kubeconfig file
// that use only that token.
func serviceAccountClient(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) (kubernetes.Interface, string) {
	t.Helper()
	pod, err := c.Client().CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "caa-" + node, Namespace: namespace},
		Spec: corev1.PodSpec{ServiceAccountName: "caa", NodeName: node,
			Containers: []corev1.Container{{Name: "caa", Image: "caa"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	expiry := int64(3600)
	tok, err := c.Client().CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "caa",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}},
		metav1.CreateOptions{})
	require.NoError(t, err, "token for the caa ServiceAccount")
	admin := c.RestConfig()
	cfg := &rest.Config{Host: admin.Host, BearerToken: tok.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData}}
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["caa"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["caa"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "caa"}
	kc.CurrentContext = "caa"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return client, path
}

// allowed asks the authorizer, as the ServiceAccount, whether a is allowed.
func allowed(ctx context.Context, t *testing.T, client kubernetes.Interface, a access) bool {
	t.Helper()
	resource, sub, _ := strings.Cut(a.resource, "/")
	review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: a.verb, Resource: resource, Subresource: sub, Namespace: a.namespace, Name: a.name,
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "access review of %s", a)
	return review.Status.Allowed
}

// overlayEnv is caa's environment as the kubelet would build it from the
// applied overlay: the ConfigMap as the apiserver stores it (envFrom),
// then the container's literal env. NODE_NAME and the Secret are added by
// the caller.
func overlayEnv(ctx context.Context, t *testing.T, c *cluster.Cluster) []string {
	t.Helper()
	ds, err := c.Client().AppsV1().DaemonSets(namespace).Get(ctx, "caa", metav1.GetOptions{})
	require.NoError(t, err)
	ctr := ds.Spec.Template.Spec.Containers[0]
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	require.NotEmpty(t, ctr.EnvFrom)
	require.NotNil(t, ctr.EnvFrom[0].ConfigMapRef)
	cm, err := c.Client().CoreV1().ConfigMaps(namespace).Get(ctx, ctr.EnvFrom[0].ConfigMapRef.Name, metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, "aws", cm.Data["CAA_PROVIDER"])
	for k, v := range cm.Data {
		env = append(env, k+"="+v)
	}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return env
}

// secretExampleKeys are the keys of an overlay's example Secret.
func secretExampleKeys(t *testing.T, overlay string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir(t), overlay, "secret.example.yaml"))
	require.NoError(t, err)
	var s corev1.Secret
	require.NoError(t, yaml.UnmarshalStrict(raw, &s))
	var keys []string
	for k := range s.StringData {
		keys = append(keys, k)
	}
	return keys
}

// hasEvent reports whether pod ns/name has an event from caa of that type
// and reason.
func hasEvent(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, typ, reason string) bool {
	t.Helper()
	events, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	require.NoError(t, err)
	for _, e := range events.Items {
		if e.Type == typ && e.Reason == reason && e.Source.Component == "caa" {
			return true
		}
	}
	return false
}

// caaProcess is one running caa; err is valid once exited is closed.
type caaProcess struct {
	cmd    *exec.Cmd
	logs   *cluster.SyncBuffer
	exited chan struct{}
	err    error
}

func startCaa(t *testing.T, bin string, env []string, args ...string) *caaProcess {
	t.Helper()
	p := &caaProcess{cmd: exec.Command(bin, args...), logs: &cluster.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("caa output:\n%s", p.logs.String())
		}
	})
	return p
}

// stop sends SIGTERM and expects a clean exit within the DaemonSet's grace.
func (p *caaProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.exited:
		require.NoError(t, p.err, "caa exits 0 on SIGTERM")
	case <-time.After(45 * time.Second):
		t.Fatal("caa did not stop within terminationGracePeriodSeconds")
	}
}

// waitFor polls cond until it holds, failing t if caa exits first or the
// timeout passes.
func waitFor(t *testing.T, p *caaProcess, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.exited:
			t.Fatalf("%s: caa exited first: %v", what, p.err)
		default:
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(100 * time.Millisecond) // a poll interval, not a synchronisation
	}
}
