package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// Page sizes of the fakes: the largest page each real cloud serves to the
// request caa's provider makes.
//   - EC2 DescribeInstances: caa asks MaxResults 1000, EC2's maximum.
//   - IBM VPC: caa asks limit 100 for instances and volumes, VPC's maximum.
//   - Azure ARM: caa's SDK pager cannot ask for a size (the VM and NIC
//     list operations take no $top) and Azure documents none; 1000 is
//     assumed, the size ARM's Resource Graph and most list APIs cap at.
var pageSizes = map[string]int{"aws": 1000, "azure": 1000, "ibmcloud": 100}

// fakeCloud is one in-process fake cloud and the caa flags and
// environment that reach it.
type fakeCloud struct {
	name  string
	core  *cloud.Cloud
	flags []string
	env   []string
	close func()
	// busy is the time the fake's handlers took, summed over requests,
	// injected latency included (the caller subtracts it).
	busy atomic.Int64
}

// timed wraps a fake's handler so that f.busy adds up its time.
func (f *fakeCloud) timed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, r)
		f.busy.Add(int64(time.Since(start)))
	})
}

// newFakeCloud starts the named cloud's fake on loopback.
func newFakeCloud(name string) (*fakeCloud, error) {
	size := pageSizes[name]
	f := &fakeCloud{name: name}
	switch name {
	case "aws":
		core := cloud.New(ec2fake.CloudOptions(cloud.Options{PageSize: size}))
		srv := httptest.NewServer(f.timed(ec2fake.NewServer(core)))
		f.core, f.close = core, srv.Close
		f.flags, f.env = []string{"--provider", "aws", "--aws-endpoint", srv.URL, "--aws-region", "us-east-1",
			"--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-image", "ami-0123456789abcdef0", "--aws-instance-type", "t3.small"},
			[]string{"AWS_ACCESS_KEY_ID=AKIDBENCH", "AWS_SECRET_ACCESS_KEY=bench-secret", "AWS_EC2_METADATA_DISABLED=true",
				"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
		return f, nil
	case "ibmcloud":
		core := cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: size, Zone: "us-south-1"})
		srv := httptest.NewServer(f.timed(vpcfake.NewServer(core)))
		f.core, f.close = core, srv.Close
		f.flags, f.env = []string{"--provider", "ibmcloud", "--ibmcloud-endpoint", srv.URL + "/v1", "--ibmcloud-iam-endpoint", srv.URL, "--ibmcloud-search-endpoint", srv.URL,
			"--ibmcloud-zone", "us-south-1", "--ibmcloud-vpc-id", vpcfake.DefaultVPC, "--ibmcloud-subnet-id", vpcfake.DefaultSubnet,
			"--ibmcloud-resource-group-id", vpcfake.DefaultResourceGroup,
			"--ibmcloud-image", "r006-bench-image", "--ibmcloud-instance-type", "bx2-2x8"},
			[]string{"IBMCLOUD_API_KEY=bench-api-key"}
		return f, nil
	case "azure":
		// The token comes from a fake App Service managed identity, with
		// no latency: Azure's token service is not the ARM API.
		token := "bench-arm-token"
		core := cloud.New(cloud.Options{PageSize: size})
		arm := httptest.NewServer(f.timed(armfake.NewServer(core, armfake.WithBearerToken(token))))
		mi := &armfake.ManagedIdentity{Token: token, Header: "bench-identity-header"}
		identity := httptest.NewServer(mi)
		subnet := "/subscriptions/" + armfake.DefaultSubscription +
			"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/peerpods"
		f.core, f.close = core, func() { arm.Close(); identity.Close() }
		f.flags, f.env = []string{"--provider", "azure", "--azure-endpoint", arm.URL,
			"--azure-subscription-id", armfake.DefaultSubscription, "--azure-resource-group", armfake.DefaultResourceGroup,
			"--azure-location", armfake.DefaultLocation, "--azure-subnet-id", subnet,
			"--azure-ssh-public-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS1iZW5jaC1rZXk caa@bench",
			"--azure-image", "Canonical:ubuntu-24_04-lts:server:latest", "--azure-instance-type", "Standard_D2as_v5",
			"--azure-poll-interval", "50ms"},
			[]string{"IDENTITY_ENDPOINT=" + identity.URL + armfake.ManagedIdentityPath, "IDENTITY_HEADER=" + mi.Header}
		return f, nil
	}
	return nil, fmt.Errorf("cloud %q: want aws, azure or ibmcloud", name)
}

// writeOps are the counters of calls that change the cloud.
var writeOps = []string{cloud.OpCreate, cloud.OpDelete, armfake.OpNICCreate, armfake.OpNICDelete, vpcfake.OpVolumeDelete}

// cloudWrites sums the write counters.
func cloudWrites(counters map[string]int64) int64 {
	var n int64
	for _, op := range writeOps {
		n += counters[op]
	}
	return n
}

// callsByOp drops the derived counters and keeps calls by operation.
func callsByOp(counters map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range counters {
		switch k {
		case "total", "created", "deleted":
			continue
		}
		out[k] = v
	}
	return out
}

// hermeticEnv is the bench's environment without anything that would
// point caa at a real cloud or cluster, plus extra.
func hermeticEnv(extra ...string) []string {
	drop := []string{"AZURE_", "IDENTITY_", "MSI_", "IMDS_ENDPOINT=", "IBMCLOUD_", "VPC_", "IBM_CREDENTIALS_FILE=",
		"AWS_", "CAA_", "KUBECONFIG=", "NODE_NAME="}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) })
	})
	return append(env, extra...)
}
