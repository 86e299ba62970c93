//go:build caa_ibmcloud || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

const (
	ibmKey       = "test-apikey-clouds-1"
	clusterGroup = "r006-kube-sg"
	otherGroup   = "r006-sg-1"
)

// ibmRig is the IBM cloud of this package on a fake VPC whose cluster
// workers are in clusterGroup, named kube-c0ffee.
type ibmRig struct {
	c   *Cloud
	srv *vpcfake.Server
	fs  *pflag.FlagSet
	url string
}

func newIBMRig(t *testing.T) ibmRig {
	t.Helper()
	core := cloud.New(conformance.Options(&conformance.Clock{}))
	srv := vpcfake.NewServer(core, vpcfake.WithAPIKey(ibmKey), vpcfake.WithNetwork(vpcfake.Network{
		VPC: vpcfake.DefaultVPC, Subnets: []string{vpcfake.DefaultSubnet},
		SecurityGroups: []string{otherGroup, clusterGroup, "r006-kube-other"},
		GroupNames:     map[string]string{clusterGroup: "kube-c0ffee", "r006-kube-other": "kube-other"},
		WorkerGroup:    clusterGroup,
	})).(*vpcfake.Server)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Setenv(ibmcloud.EnvAPIKey, ibmKey)
	c := ibmcloudCloud()
	fs := pflag.NewFlagSet("caa", pflag.ContinueOnError)
	c.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--ibmcloud-endpoint", hs.URL + "/v1", "--ibmcloud-iam-endpoint", hs.URL,
		"--ibmcloud-search-endpoint", hs.URL, "--ibmcloud-security-group-ids", otherGroup}))
	return ibmRig{c: c, srv: srv, fs: fs, url: hs.URL}
}

func (r ibmRig) set(t *testing.T, args ...string) {
	t.Helper()
	require.NoError(t, r.fs.Parse(args))
}

// create opens the provider and makes one VM, returning its id.
func (r ibmRig) create(t *testing.T) (string, error) {
	t.Helper()
	p, _, err := r.c.Open(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	vm, err := p.Create(context.Background(), conformance.Spec(1, "node-a"))
	require.NoError(t, err)
	return vm.ID, nil
}

func clusterInfo(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cluster-info"}, Data: data}
}

// TestIBMCloudJoinsTheClusterSecurityGroup: on a cluster of IBM Cloud's
// Kubernetes service (kube-system/cluster-info names it, as upstream's
// adaptor reads it) every VM's network attachment is in the workers'
// security group kube-<cluster id> besides the configured ones, found in
// the VPC by name; the fake VPC lets the workers reach it. Without the
// group it would not: the fake holds a VM outside it unreachable.
func TestIBMCloudJoinsTheClusterSecurityGroup(t *testing.T) {
	for name, data := range map[string]map[string]string{
		"cluster_id":          {"cluster_id": "c0ffee"},
		"cluster-config.json": {"cluster-config.json": `{"cluster_id":"c0ffee","name":"prod"}`},
	} {
		t.Run(name, func(t *testing.T) {
			r := newIBMRig(t)
			r.set(t, "--ibmcloud-zone", "us-south-1", "--ibmcloud-subnet-id", vpcfake.DefaultSubnet)
			r.c.UseCluster(fake.NewClientset(clusterInfo(data)), "node-a")
			id, err := r.create(t)
			require.NoError(t, err)
			req, _ := r.srv.CreateRequest(id)
			assert.Equal(t, []string{otherGroup, clusterGroup}, req.SecurityGroups)
			ok, why := r.srv.Reachable(id)
			assert.True(t, ok, why)
		})
	}
}

// TestIBMCloudWithoutTheClusterGroup: a cluster without cluster-info (not
// IBM's service) or --ibmcloud-cluster-id=none adds no group, and the fake
// shows what that means: the workers cannot reach the VM. A cluster id
// whose group the VPC lacks, a refused read of the ConfigMap, and a
// ConfigMap without the id refuse the start naming the fix.
func TestIBMCloudWithoutTheClusterGroup(t *testing.T) {
	placement := []string{"--ibmcloud-zone", "us-south-1", "--ibmcloud-subnet-id", vpcfake.DefaultSubnet}
	for name, tc := range map[string]struct {
		kube *fake.Clientset
		args []string
	}{
		"no cluster-info": {kube: fake.NewClientset()},
		"cluster id none": {kube: fake.NewClientset(clusterInfo(map[string]string{"cluster_id": "c0ffee"})), args: []string{"--ibmcloud-cluster-id", "none"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := newIBMRig(t)
			r.set(t, append(placement, tc.args...)...)
			r.c.UseCluster(tc.kube, "node-a")
			id, err := r.create(t)
			require.NoError(t, err)
			ok, why := r.srv.Reachable(id)
			assert.False(t, ok)
			assert.Contains(t, why, "15150")
		})
	}

	forbidden := fake.NewClientset()
	forbidden.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "cluster-info", nil)
	})
	for name, tc := range map[string]struct {
		kube *fake.Clientset
		args []string
		want string
	}{
		"unknown cluster": {kube: fake.NewClientset(), args: []string{"--ibmcloud-cluster-id", "deadbeef"},
			want: "has no security group kube-deadbeef"},
		"refused read": {kube: forbidden, want: "apply the Role caa-cluster-info"},
		"no id":        {kube: fake.NewClientset(clusterInfo(map[string]string{"other": "x"})), want: "set --ibmcloud-cluster-id"},
	} {
		t.Run(name, func(t *testing.T) {
			r := newIBMRig(t)
			r.set(t, append(placement, tc.args...)...)
			r.c.UseCluster(tc.kube, "node-a")
			_, err := r.create(t)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestIBMCloudPlacementFromTheNode: with no zone, subnet or region set, a
// worker of IBM's service gives them from its labels, as upstream's adaptor
// takes them, so a migrated peer-pods-cm without them starts; a setting
// given wins over its label.
func TestIBMCloudPlacementFromTheNode(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		"topology.kubernetes.io/zone": "us-south-1", "topology.kubernetes.io/region": "us-south",
		"ibm-provider.kubernetes.io/subnet-id": vpcfake.DefaultSubnet,
	}}}
	r := newIBMRig(t)
	r.c.UseCluster(fake.NewClientset(node), "node-a")
	id, err := r.create(t)
	require.NoError(t, err)
	ok, why := r.srv.Reachable(id)
	assert.False(t, ok, "no cluster-info: no cluster group (%s)", why)
	assert.Equal(t, "us-south-1", r.fs.Lookup("ibmcloud-zone").Value.String(), "the zone from the label")

	// A node without IBM's subnet label gives no zone or subnet: the
	// check names the flag.
	r = newIBMRig(t)
	r.c.UseCluster(fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a",
		Labels: map[string]string{"topology.kubernetes.io/zone": "us-south-1"}}}), "node-a")
	_, err = r.create(t)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--ibmcloud-zone")

	r = newIBMRig(t)
	r.set(t, "--ibmcloud-zone", "us-south-2")
	r.c.UseCluster(fake.NewClientset(node), "node-a")
	p, _, err := r.c.Open(context.Background(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	vm, err := p.Create(context.Background(), conformance.Spec(2, "node-a"))
	require.NoError(t, err)
	assert.Equal(t, "us-south-2", vm.Zone, "the flag wins over the label")
}
