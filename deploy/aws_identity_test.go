package deploy_test

import (
	"maps"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// keylessAWS are the overlays that run caa on AWS without static keys,
// each with the ServiceAccount annotation it adds ("" for none). Both are
// overlays/aws without the credentials Secret, so every check of
// overlays/aws (render_test.go, manifests_test.go, memory_test.go,
// static_test.go) holds for them as long as TestAWSKeylessOverlays shows
// they differ from it in nothing else.
var keylessAWS = map[string]string{
	"overlays/aws-pod-identity": "",
	"overlays/aws-irsa":         "eks.amazonaws.com/role-arn",
}

var roleARN = regexp.MustCompile(`^arn:aws:iam::[0-9]{12}:role/[\w+=,.@/-]+$`)

// TestAWSKeylessOverlays renders each keyless AWS overlay beside
// overlays/aws: the same objects, field for field, except that the
// DaemonSet reads no Secret and, for IRSA, the ServiceAccount names the
// role. Their READMEs say where the permissions are.
func TestAWSKeylessOverlays(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	static := decode(t, render(t, bin, "overlays/aws"))
	for name, annotation := range keylessAWS {
		t.Run(name, func(t *testing.T) {
			assertOnlyCredentialsDiffer(t, name, "overlays/aws", static, decode(t, render(t, bin, name)), func(t *testing.T, got *unstructured.Unstructured) {
				if got.GetKind() != "ServiceAccount" {
					return
				}
				if annotation == "" {
					assert.Empty(t, got.GetAnnotations(), "Pod Identity needs no annotation: the association is made in EKS")
					return
				}
				assert.Regexp(t, roleARN, got.GetAnnotations()[annotation], "%s names an IAM role", annotation)
				dropAnnotation(got, annotation)
			})
			assertReadmeSays(t, name, "overlays/aws/iam-policy.json", name+"/README.md says where the permissions are")
		})
	}
}

// TestAWSKeylessOverlaysOnTheAPIServer dry-runs each keyless AWS overlay
// against a real kube-apiserver.
func TestAWSKeylessOverlaysOnTheAPIServer(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	dryRunOnTheAPIServer(t, slices.Sorted(maps.Keys(keylessAWS))...)
}
