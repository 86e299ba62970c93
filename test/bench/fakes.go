package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
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
	// served counts the requests whose time busy holds: the core counts a
	// call when it starts, so a call still in flight when a run stops
	// (a background preflight, an audit) is in its counters, not in busy.
	served atomic.Int64
	// sent is the response bytes (bodies) the fake wrote to its clients.
	sent atomic.Int64
	// budget meters the calls with the cloud's published limits (nil:
	// none, see newBudgetedFake).
	budget *cloud.Budget
	// relabeled counts calls S6 tells apart from others the fake counts
	// under the same operation: by label, and the operation they came
	// from (see relabel).
	relMu     sync.Mutex
	relabeled map[[2]string]int64
	// lroUntil is, by lower-cased resource path, until when a GET of an
	// Azure resource just written is the SDK's own (see relabel).
	lroUntil map[string]time.Time
}

// Labels of calls the fakes count under another operation.
const (
	// opGraph: an Azure Resource Graph query (the fake counts it as a
	// list).
	opGraph = "graph"
	// opSearch: an IBM Cloud Global Search request (the fake counts it as
	// a list).
	opSearch = "search"
	// opLookup: a VPC instance listing filtered by name, which matches
	// one instance at most (the fake counts it as a list); EC2's
	// client-token lookup counts under the same name in its fake.
	opLookup = "lookup"
	// lroPrefix+op: a GET the Azure SDK makes of a resource it just wrote,
	// while it waits for the write's long-running operation (the final
	// GET after the operation, or polls of the resource itself).
	lroPrefix = "lro:"
	// lroWindow is how long after a PUT or DELETE answered a GET of the
	// same resource counts as the SDK's: the SDK polls at most every
	// second, and caa's own next look at a new VM is 30 s away.
	lroWindow = 5 * time.Second
)

// relabel notes a request the fake counts under an operation that says
// less than S6 needs: a Resource Graph query, a Global Search request, a
// VPC listing by name, an Azure SDK's GET of what it just wrote.
func (f *fakeCloud) relabel(r *http.Request) {
	from, to := "", ""
	switch {
	case f.name == "azure" && strings.Contains(r.URL.Path, "/providers/Microsoft.ResourceGraph/"):
		from, to = cloud.OpList, opGraph
	case f.name == "azure" && r.Method == http.MethodGet && f.lroGet(r.URL.Path):
		from = cloud.OpGet
		if strings.Contains(strings.ToLower(r.URL.Path), "/microsoft.network/networkinterfaces/") {
			from = armfake.OpNICGet
		}
		to = lroPrefix + from
	case f.name == "ibmcloud" && strings.HasPrefix(r.URL.Path, "/v3/resources/search"):
		from, to = cloud.OpList, opSearch
	case f.name == "ibmcloud" && r.Method == http.MethodGet && r.URL.Path == "/v1/instances" && r.URL.Query().Has("name"):
		from, to = cloud.OpList, opLookup
	}
	if from == "" {
		return
	}
	f.relMu.Lock()
	defer f.relMu.Unlock()
	if f.relabeled == nil {
		f.relabeled = map[[2]string]int64{}
	}
	f.relabeled[[2]string{from, to}]++
}

// lroGet reports whether a GET of path comes within lroWindow of a write
// of it that has answered.
func (f *fakeCloud) lroGet(path string) bool {
	f.relMu.Lock()
	defer f.relMu.Unlock()
	return time.Now().Before(f.lroUntil[strings.ToLower(path)])
}

// wrote notes an Azure PUT or DELETE that has answered.
func (f *fakeCloud) wrote(r *http.Request) {
	if f.name != "azure" || (r.Method != http.MethodPut && r.Method != http.MethodDelete) {
		return
	}
	f.relMu.Lock()
	defer f.relMu.Unlock()
	if f.lroUntil == nil {
		f.lroUntil = map[string]time.Time{}
	}
	f.lroUntil[strings.ToLower(r.URL.Path)] = time.Now().Add(lroWindow)
}

// counters are the core's counters with the relabeled calls moved from
// their operation to their label.
func (f *fakeCloud) counters() map[string]int64 {
	f.relMu.Lock()
	defer f.relMu.Unlock()
	out := f.core.Counters()
	for k, n := range f.relabeled {
		out[k[0]] -= n
		out[k[1]] += n
		if out[k[0]] == 0 {
			delete(out, k[0])
		}
	}
	return out
}

// resetCounters zeroes the core's counters and the relabeled calls.
func (f *fakeCloud) resetCounters() {
	f.relMu.Lock()
	defer f.relMu.Unlock()
	f.core.ResetCounters()
	f.relabeled = nil
}

// timed wraps a fake's handler so that f.busy adds up its time and f.sent
// its response bytes; it notes the calls to relabel.
func (f *fakeCloud) timed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		f.relabel(r)
		h.ServeHTTP(&byteCounter{ResponseWriter: w, n: &f.sent}, r)
		f.wrote(r)
		f.busy.Add(int64(time.Since(start)))
		f.served.Add(1)
	})
}

// byteCounter adds the bytes of a response body to n.
type byteCounter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w *byteCounter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n.Add(int64(n))
	return n, err
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (w *byteCounter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newFakeCloud starts the named cloud's fake on loopback, with no limits.
func newFakeCloud(name string) (*fakeCloud, error) { return newBudgetedFake(name, nil) }

// publishedBudget is the named cloud's budget with the limits its fake
// publishes, on the clock now.
func publishedBudget(name string, now func() time.Time) (*cloud.Budget, error) {
	switch name {
	case "aws":
		return ec2fake.NewBudget(now), nil
	case "azure":
		return armfake.NewBudget(now), nil
	case "ibmcloud":
		return vpcfake.NewBudget(now), nil
	}
	return nil, fmt.Errorf("cloud %q: want aws, azure or ibmcloud", name)
}

// newBudgetedFake starts the named cloud's fake on loopback; a non-nil
// budget makes it enforce the budget's limits (its WithBudget option).
func newBudgetedFake(name string, budget *cloud.Budget) (*fakeCloud, error) {
	size := pageSizes[name]
	f := &fakeCloud{name: name, budget: budget}
	switch name {
	case "aws":
		core := cloud.New(ec2fake.CloudOptions(cloud.Options{PageSize: size}))
		var opts []ec2fake.Option
		if budget != nil {
			opts = append(opts, ec2fake.WithBudget(budget))
		}
		srv := httptest.NewServer(f.timed(ec2fake.NewServer(core, opts...)))
		f.core, f.close = core, srv.Close
		f.flags, f.env = []string{"--provider", "aws", "--aws-endpoint", srv.URL, "--aws-region", "us-east-1",
			"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-image", "ami-0123456789abcdef0", "--aws-instance-type", "m6a.large"},
			[]string{"AWS_ACCESS_KEY_ID=AKIDBENCH", "AWS_SECRET_ACCESS_KEY=bench-secret", "AWS_EC2_METADATA_DISABLED=true",
				"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
		return f, nil
	case "ibmcloud":
		core := cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: size, Zone: "us-south-1"})
		var opts []vpcfake.Option
		if budget != nil {
			opts = append(opts, vpcfake.WithBudget(budget))
		}
		srv := httptest.NewServer(f.timed(vpcfake.NewServer(core, opts...)))
		f.core, f.close = core, srv.Close
		f.flags, f.env = []string{"--provider", "ibmcloud", "--ibmcloud-endpoint", srv.URL + "/v1", "--ibmcloud-iam-endpoint", srv.URL, "--ibmcloud-search-endpoint", srv.URL,
			"--ibmcloud-zone", "us-south-1", "--ibmcloud-vpc-id", vpcfake.DefaultVPC, "--ibmcloud-subnet-id", vpcfake.DefaultSubnet,
			"--ibmcloud-resource-group-id", vpcfake.DefaultResourceGroup,
			"--ibmcloud-image", "r006-bench-image", "--ibmcloud-instance-type", "bx3dc-2x10"},
			[]string{"IBMCLOUD_API_KEY=bench-api-key"}
		return f, nil
	case "azure":
		// The token comes from a fake App Service managed identity, with
		// no latency: Azure's token service is not the ARM API.
		token := "bench-arm-token"
		core := cloud.New(cloud.Options{PageSize: size})
		opts := []armfake.Option{armfake.WithBearerToken(token)}
		if budget != nil {
			opts = append(opts, armfake.WithBudget(budget))
		}
		arm := httptest.NewServer(f.timed(armfake.NewServer(core, opts...)))
		mi := &armfake.ManagedIdentity{Token: token, Header: "bench-identity-header"}
		identity := httptest.NewServer(mi)
		subnet := "/subscriptions/" + armfake.DefaultSubscription +
			"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/peerpods"
		f.core, f.close = core, func() { arm.Close(); identity.Close() }
		f.flags, f.env = []string{"--provider", "azure", "--azure-endpoint", arm.URL,
			"--azure-subscription-id", armfake.DefaultSubscription, "--azure-resource-group", armfake.DefaultResourceGroup,
			"--azure-location", armfake.DefaultLocation, "--azure-subnet-id", subnet,
			"--azure-ssh-public-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS1iZW5jaC1rZXk caa@bench",
			"--azure-image", "Canonical:ubuntu-24_04-lts:server:latest", "--azure-instance-type", "Standard_DC2as_v5",
			"--azure-poll-interval", "50ms"},
			[]string{"IDENTITY_ENDPOINT=" + identity.URL + armfake.ManagedIdentityPath, "IDENTITY_HEADER=" + mi.Header}
		return f, nil
	}
	return nil, fmt.Errorf("cloud %q: want aws, azure or ibmcloud", name)
}

// writeOps are the counters of calls that change the cloud.
var writeOps = []string{cloud.OpCreate, cloud.OpDelete, armfake.OpNICCreate, armfake.OpNICDelete, vpcfake.OpVolumeDelete, vpcfake.OpTagAttach}

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
	// The bench's caa processes run outside pods: nothing can verify a
	// hand-over asker, so S7 and S9 opt into the hand-over explicitly (caa
	// refuses every asker otherwise), as the e2e launcher does.
	env = append(env, "CAA_HANDOVER_ALLOW_UNVERIFIED=true")
	return append(env, extra...)
}
