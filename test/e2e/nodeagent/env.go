package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// errConfig marks a container whose configuration cannot be resolved (a
// missing ConfigMap, Secret or key): the kubelet's CreateContainerConfigError.
var errConfig = errors.New("container config")

// podIP is every pod's address here: all "pods" share this machine's
// loopback, which stands in for the pod network.
const podIP = "127.0.0.1"

// envVarName is what the kubelet accepts as a variable name from envFrom;
// other keys are skipped, as the kubelet does (with an event there).
var envVarName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// env is a container's environment in definition order; a later
// definition of a name replaces the value in place.
type env struct {
	names  []string
	values map[string]string
}

func newEnv() *env { return &env{values: map[string]string{}} }

func (e *env) set(name, value string) {
	if _, ok := e.values[name]; !ok {
		e.names = append(e.names, name)
	}
	e.values[name] = value
}

func (e *env) get(name string) (string, bool) {
	v, ok := e.values[name]
	return v, ok
}

// list returns NAME=value lines in definition order.
func (e *env) list() []string {
	out := make([]string, 0, len(e.names))
	for _, n := range e.names {
		out = append(out, n+"="+e.values[n])
	}
	return out
}

// resolveEnv computes c's environment the way the kubelet does: envFrom
// sources in order, then env entries in order (a later one wins), each
// literal value with $(NAME) references expanded against what is defined
// so far. A missing ConfigMap, Secret or key fails unless marked optional.
func resolveEnv(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, c *corev1.Container) (*env, error) {
	e := newEnv()
	for _, from := range c.EnvFrom {
		data, err := envFromData(ctx, client, pod.Namespace, from)
		if err != nil {
			return nil, err
		}
		for _, k := range sortedKeys(data) {
			name := from.Prefix + k
			if envVarName.MatchString(name) {
				e.set(name, data[k])
			}
		}
	}
	for _, v := range c.Env {
		if v.ValueFrom == nil {
			e.set(v.Name, expand(v.Value, e.get))
			continue
		}
		value, ok, err := valueFrom(ctx, client, pod, v)
		if err != nil {
			return nil, err
		}
		if ok {
			e.set(v.Name, value)
		}
	}
	return e, nil
}

// envFromData reads one envFrom source; an optional missing source is empty.
func envFromData(ctx context.Context, client kubernetes.Interface, ns string, from corev1.EnvFromSource) (map[string]string, error) {
	switch {
	case from.ConfigMapRef != nil:
		ref := from.ConfigMapRef
		cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && isOptional(ref.Optional) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: envFrom configmap %s/%s: %w", errConfig, ns, ref.Name, err)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		ref := from.SecretRef
		s, err := client.CoreV1().Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && isOptional(ref.Optional) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: envFrom secret %s/%s: %w", errConfig, ns, ref.Name, err)
		}
		out := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: envFrom entry names neither a configmap nor a secret", errConfig)
}

// valueFrom resolves one env entry's valueFrom; ok is false for an optional
// reference that is missing (the variable is then left undefined).
func valueFrom(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v corev1.EnvVar) (value string, ok bool, err error) {
	src := v.ValueFrom
	switch {
	case src.FieldRef != nil:
		value, err := fieldValue(pod, src.FieldRef.FieldPath)
		if err != nil {
			return "", false, fmt.Errorf("%w: env %s: %w", errConfig, v.Name, err)
		}
		return value, true, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("%w: env %s: configmap %s/%s: %w", errConfig, v.Name, pod.Namespace, ref.Name, err)
		}
		value, found := cm.Data[ref.Key]
		if !found {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("%w: env %s: couldn't find key %s in configmap %s/%s", errConfig, v.Name, ref.Key, pod.Namespace, ref.Name)
		}
		return value, true, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("%w: env %s: secret %s/%s: %w", errConfig, v.Name, pod.Namespace, ref.Name, err)
		}
		value, found := s.Data[ref.Key]
		if !found {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("%w: env %s: couldn't find key %s in secret %s/%s", errConfig, v.Name, ref.Key, pod.Namespace, ref.Name)
		}
		return string(value), true, nil
	}
	return "", false, fmt.Errorf("%w: env %s: only fieldRef, configMapKeyRef and secretKeyRef are supported", errConfig, v.Name)
}

// fieldValue answers the downward API's field paths for env.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.hostIP":
		return podIP, nil
	}
	for _, m := range []struct {
		prefix string
		values map[string]string
	}{{"metadata.labels", pod.Labels}, {"metadata.annotations", pod.Annotations}} {
		if key, ok := strings.CutPrefix(path, m.prefix+"['"); ok {
			if key, ok = strings.CutSuffix(key, "']"); ok {
				return m.values[key], nil
			}
		}
	}
	return "", fmt.Errorf("unsupported fieldPath %q", path)
}

// expand replaces $(NAME) with NAME's value when it is defined and keeps
// the reference as written when not; $$ escapes a dollar. These are the
// kubelet's rules for env values, command and args.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func isOptional(p *bool) bool { return p != nil && *p }
