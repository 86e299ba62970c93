package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestIDIsTheKubeSystemUID(t *testing.T) {
	client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: "ks-uid"}})
	id, err := ID(context.Background(), client)
	require.NoError(t, err)
	assert.Equal(t, "ks-uid", id)
	_, err = ID(context.Background(), fake.NewClientset())
	assert.ErrorContains(t, err, "--cluster-id")
}
