package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/podvm"
)

// PullSecrets finds a pod's image-pull credentials, as the container auth
// file the pod VM's confidential-data-hub reads (/run/peerpod/auth.json).
// The result is a secret: never logged, never in the ledger.
type PullSecrets interface {
	// AuthJSON returns {"auths": {...}} from the secrets the pod and its
	// service account name, nil when they name none; uid guards against a
	// newer pod of the same name.
	AuthJSON(ctx context.Context, namespace, name, uid string) ([]byte, error)
}

// EventPullSecrets is the pod event saying its VM got no image-pull
// credentials, and why.
const EventPullSecrets = "ImagePullCredentialsOmitted"

// pullSecretsTimeout bounds the API reads for one sandbox's credentials.
const pullSecretsTimeout = 10 * time.Second

// initData is the initdata document (TOML) the sandbox's VM gets, decoded
// exactly once whatever its source: kata's CreateVM annotation (the shim
// sends the document it decoded from the pod's annotation), the pod's own
// annotation after a caa restart lost the CreateVM's copy (still gzip and
// base64, as the user wrote it), or the cluster default (--initdata-file).
// podvm.UserData encodes the result once more for the VM.
func (m *Manager) initData(l *live, s ledger.Sandbox) (string, error) {
	m.mu.Lock()
	doc, from := l.initData, "the CreateVM annotation "+AnnotationInitData
	m.mu.Unlock()
	if doc == "" {
		if pod := m.cfg.Pods.Pod(s.PodUID); pod != nil && pod.Annotations[AnnotationInitData] != "" {
			doc, from = pod.Annotations[AnnotationInitData], "pod "+s.PodRef()+"'s annotation "+AnnotationInitData
		}
	}
	if doc == "" {
		doc, from = m.cfg.DefaultInitData, "the cluster default (--initdata-file)"
	}
	return NormalizeInitData(doc, from)
}

// NormalizeInitData returns the initdata document doc holds: doc itself
// when it is the TOML document, its decoding when it is the annotation's
// gzip+base64 form (a TOML document is never valid base64 of gzip data,
// whose encoding starts "H4sI"). from names the source in errors.
func NormalizeInitData(doc, from string) (string, error) {
	if doc == "" {
		return "", nil
	}
	if podvm.LooksEncodedInitData(doc) {
		dec, err := podvm.DecodeInitData(doc)
		if err != nil {
			return "", fmt.Errorf("initdata from %s: %w: set it to the document gzipped then base64-encoded, as kata expects", from, err)
		}
		doc = dec
	}
	if len(doc) > MaxInitData {
		return "", fmt.Errorf("initdata from %s is %d bytes decoded, the limit is %d (it travels in the VM's user data)", from, len(doc), MaxInitData)
	}
	return doc, nil
}

// authJSON reads the pod's image-pull credentials for its VM. As upstream
// (and the kubelet), a secret that cannot be read leaves the VM without
// credentials rather than failing the sandbox: a public image still pulls.
// Each miss is a warning event on the pod that names no secret value.
func (m *Manager) authJSON(ctx context.Context, s ledger.Sandbox) []byte {
	if m.cfg.PullSecrets == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, pullSecretsTimeout)
	defer cancel()
	b, err := m.cfg.PullSecrets.AuthJSON(ctx, s.Namespace, s.Name, s.PodUID)
	switch {
	case err != nil:
		m.cfg.Log.Warn("reading the pod's image-pull secrets failed; its VM gets none", "sandbox", s.ID, "pod", s.PodRef(), "err", err)
		m.event(s, true, EventPullSecrets, fmt.Sprintf("sandbox %s: its VM gets no image-pull credentials: %v", short(s.ID), err))
		return nil
	case len(b) > podvm.MaxAuthJSON:
		m.cfg.Log.Warn("the pod's image-pull credentials are over the cap; its VM gets none", "sandbox", s.ID, "pod", s.PodRef(), "bytes", len(b), "cap", podvm.MaxAuthJSON)
		m.event(s, true, EventPullSecrets, fmt.Sprintf("sandbox %s: its VM gets no image-pull credentials: they are %d bytes as auth.json, over the %d-byte cap; name fewer or smaller imagePullSecrets on the pod and its service account",
			short(s.ID), len(b), podvm.MaxAuthJSON))
		clear(b)
		return nil
	}
	return b
}

// KubePullSecrets reads image-pull credentials from the API server: the
// secrets the pod names in imagePullSecrets (which the ServiceAccount
// admission plugin fills from its service account when the pod names none)
// and, unless AsNode, those its service account (default "default") names,
// as upstream's adaptor does; a registry in both takes the pod's.
// kubernetes.io/dockerconfigjson and dockercfg secrets are read; entries
// with neither auth nor username and password are skipped; a secret that
// is missing is skipped, as the kubelet does.
type KubePullSecrets struct {
	Client kubernetes.Interface
	// AsNode: Client is the node's kubelet identity (system:node:<name>),
	// which reads what the kubelet reads to pull the pod's images: the pod
	// and the secrets it names. The Node authorizer lets a node read only
	// those of pods bound to it, and no service account.
	AsNode bool
}

var _ PullSecrets = KubePullSecrets{}

type dockerAuth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Auth     string `json:"auth"`
}

// AuthJSON implements PullSecrets.
func (k KubePullSecrets) AuthJSON(ctx context.Context, namespace, name, uid string) ([]byte, error) {
	pod, err := k.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read pod %s/%s: %w", namespace, name, err)
	}
	if uid != "" && string(pod.UID) != uid {
		return nil, fmt.Errorf("pod %s/%s is now %s, not the sandbox's %s", namespace, name, pod.UID, uid)
	}
	var names []string
	if !k.AsNode {
		if names, err = k.accountSecrets(ctx, namespace, pod.Spec.ServiceAccountName); err != nil {
			return nil, err
		}
	}
	for _, r := range pod.Spec.ImagePullSecrets {
		names = append(names, r.Name)
	}
	auths := map[string]dockerAuth{}
	for _, n := range names {
		sec, err := k.Client.CoreV1().Secrets(namespace).Get(ctx, n, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("read image-pull secret %s/%s: %w", namespace, n, err)
		}
		regs, err := registries(sec)
		if err != nil {
			return nil, fmt.Errorf("image-pull secret %s/%s: %w", namespace, n, err)
		}
		maps.Copy(auths, regs)
	}
	if len(auths) == 0 {
		return nil, nil
	}
	return json.Marshal(struct {
		Auths map[string]dockerAuth `json:"auths"`
	}{auths})
}

// accountSecrets names the image-pull secrets of service account sa.
func (k KubePullSecrets) accountSecrets(ctx context.Context, namespace, sa string) ([]string, error) {
	if sa == "" {
		sa = "default"
	}
	acct, err := k.Client.CoreV1().ServiceAccounts(namespace).Get(ctx, sa, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read service account %s/%s: %w", namespace, sa, err)
	}
	var names []string
	for _, r := range acct.ImagePullSecrets {
		names = append(names, r.Name)
	}
	return names, nil
}

// registries reads one secret's credentials, each reduced to its auth
// field (base64 of user:password), as the auth file carries them.
func registries(sec *corev1.Secret) (map[string]dockerAuth, error) {
	var regs map[string]dockerAuth
	if b, ok := sec.Data[corev1.DockerConfigJsonKey]; ok {
		var doc struct {
			Auths map[string]dockerAuth `json:"auths"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, errors.New(corev1.DockerConfigJsonKey + " is not a container auth file (JSON with \"auths\")")
		}
		regs = doc.Auths
	} else if b, ok := sec.Data[corev1.DockerConfigKey]; ok {
		if err := json.Unmarshal(b, &regs); err != nil {
			return nil, errors.New(corev1.DockerConfigKey + " is not a JSON map of registries")
		}
	}
	out := map[string]dockerAuth{}
	for _, reg := range slices.Sorted(maps.Keys(regs)) {
		a := regs[reg]
		if a.Auth == "" {
			if a.Username == "" || a.Password == "" {
				continue
			}
			a.Auth = base64.StdEncoding.EncodeToString([]byte(a.Username + ":" + a.Password))
		}
		out[reg] = dockerAuth{Auth: a.Auth}
	}
	return out, nil
}
