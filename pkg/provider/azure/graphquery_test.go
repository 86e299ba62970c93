package azure

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resourcegraph/armresourcegraph"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

// graphStub answers Resource Graph's POSTs with canned bodies, one per
// query in order (the last one again once they run out), and keeps what
// it was sent.
type graphStub struct {
	mu      sync.Mutex
	answers []string
	sent    []*http.Request
	bodies  []string
}

func (s *graphStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.sent = append(s.sent, r)
	s.bodies = append(s.bodies, string(body))
	answer := s.answers[min(len(s.sent), len(s.answers))-1]
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, answer)
}

func stubConfig(url string) Config {
	return Config{
		SubscriptionID: "00000000-0000-0000-0000-000000000001", ResourceGroup: "rg", Location: "westeurope",
		SubnetID:      "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/s",
		AdminUsername: "caa", SSHPublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS10ZXN0LWtleQ caa@test",
		Endpoint: url, PollInterval: time.Millisecond, RetryDelay: time.Millisecond,
	}
}

func newStubbedProvider(t *testing.T, answers ...string) (*Provider, *graphStub) {
	t.Helper()
	stub := &graphStub{answers: answers}
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)
	p, err := New(context.Background(), stubConfig(srv.URL), WithCredential(benchToken("stub-token")))
	require.NoError(t, err)
	return p, stub
}

var stubSel = provider.Selector{Cluster: "c1", Node: "n1"}

// stubVM is a running VM row of nodeQuery's answer for stubSel, as JSON.
func stubVM(name string, extra string) string {
	return fmt.Sprintf(`{"id":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/%s","name":%q,`+
		`"type":"Microsoft.Compute/virtualMachines","location":"westeurope","zones":["2"],`+
		`"tags":{"caa-managed-by":"caa","caa-cluster":"c1","caa-node":"n1","team":"x"},"provisioningState":"Succeeded",`+
		`"powerState":"PowerState/running","timeCreated":"2026-01-02T03:04:05.5Z","vmSize":"Standard_D2s_v5",`+
		`"image":"{\"publisher\":\"p\",\"offer\":\"o\",\"sku\":\"s\",\"version\":\"1\"}","privateIP":"","attachedTo":""%s}`, name, name, extra)
}

func stubNIC(vm, ip string) string {
	return fmt.Sprintf(`{"id":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/%s-nic","name":"%s-nic",`+
		`"type":"microsoft.network/networkinterfaces","location":"westeurope","tags":{"caa-managed-by":"caa","caa-cluster":"c1","caa-node":"n1"},`+
		`"privateIP":%q,"attachedTo":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/%s"}`, vm, vm, ip, vm)
}

func answer(skipToken string, rows ...string) string {
	tok := ""
	if skipToken != "" {
		tok = fmt.Sprintf(`,"$skipToken":%q`, skipToken)
	}
	return fmt.Sprintf(`{"totalRecords":%d,"count":%d,"data":[%s],"facets":[],"resultTruncated":"false"%s}`,
		len(rows), len(rows), strings.Join(rows, ","), tok)
}

// TestQueryGraphSendsWhatTheSDKClientSends: the query goes out as the
// generated armresourcegraph client sends it (method, path, api-version,
// headers, User-Agent, body), so the real service and the fakes see one
// call whichever decodes the answer.
func TestQueryGraphSendsWhatTheSDKClientSends(t *testing.T) {
	p, stub := newStubbedProvider(t, answer(""))
	q, err := p.queryFor(stubSel)
	require.NoError(t, err)
	req := p.graphQuery(q)
	req.Options.SkipToken = new("page-2")
	_, err = queryGraph[nodeRow](context.Background(), p, opList, req)
	require.NoError(t, err)

	cc, err := p.cfg.cloudConfig()
	require.NoError(t, err)
	sdk, err := armresourcegraph.NewClient(credential{benchToken("stub-token")}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: cc, InsecureAllowCredentialWithHTTP: true, Telemetry: policy.TelemetryOptions{ApplicationID: "caa"}}})
	require.NoError(t, err)
	_, err = sdk.Resources(context.Background(), req, nil)
	require.NoError(t, err)

	require.Len(t, stub.sent, 2)
	ours, theirs := stub.sent[0], stub.sent[1]
	assert.Equal(t, theirs.Method, ours.Method)
	assert.Equal(t, theirs.URL.String(), ours.URL.String())
	for _, h := range []string{"Accept", "Content-Type", "User-Agent", "Authorization", "Content-Length"} {
		assert.Equal(t, theirs.Header.Get(h), ours.Header.Get(h), h)
	}
	assert.Contains(t, ours.Header.Get("User-Agent"), "armresourcegraph/"+graphModuleVersion, "the module's version in go.mod")
	assert.Equal(t, stub.bodies[1], stub.bodies[0])
	assert.Contains(t, stub.bodies[0], `"resultFormat":"objectArray"`)
	assert.Contains(t, stub.bodies[0], `"$top":1000`)
	assert.Contains(t, stub.bodies[0], `"$skipToken":"page-2"`)
}

// TestListReadsTypedRows: a well-formed answer reads as the SDK's model
// read it: zone, tags, state, creation time, size, image, the NIC's IP.
func TestListReadsTypedRows(t *testing.T) {
	p, _ := newStubbedProvider(t, answer("", stubVM("vm-a", ""), stubNIC("vm-a", "10.0.0.4")))
	vms, err := p.List(context.Background(), stubSel)
	require.NoError(t, err)
	require.Len(t, vms, 1)
	vm := vms[0]
	assert.Equal(t, "vm-a", vm.Name)
	assert.Equal(t, "2", vm.Zone)
	assert.Equal(t, provider.StateRunning, vm.State)
	assert.Equal(t, "Standard_D2s_v5", vm.InstanceType)
	assert.Equal(t, "p:o:s:1", vm.Image)
	assert.Equal(t, []string{"10.0.0.4"}, vm.IPs)
	assert.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.UTC), vm.CreatedAt.UTC())
	assert.Equal(t, "x", vm.Tags["team"])
}

// TestListPagesOnTheSkipToken: an answer with a $skipToken is followed by
// the same query carrying it, until an answer has none.
func TestListPagesOnTheSkipToken(t *testing.T) {
	p, stub := newStubbedProvider(t,
		answer("tok-1", stubVM("vm-a", "")),
		answer("tok-2", stubNIC("vm-a", "10.0.0.4"), stubVM("vm-b", "")),
		answer("", stubNIC("vm-b", "10.0.0.5")))
	vms, err := p.List(context.Background(), stubSel)
	require.NoError(t, err)
	require.Len(t, vms, 2)
	assert.Equal(t, []string{"10.0.0.4"}, vms[0].IPs)
	assert.Equal(t, []string{"10.0.0.5"}, vms[1].IPs)
	require.Len(t, stub.bodies, 3)
	assert.NotContains(t, stub.bodies[0], "$skipToken")
	assert.Contains(t, stub.bodies[1], `"$skipToken":"tok-1"`)
	assert.Contains(t, stub.bodies[2], `"$skipToken":"tok-2"`)
	first := strings.Replace(stub.bodies[1], `"$skipToken":"tok-1",`, "", 1)
	assert.JSONEq(t, stub.bodies[0], first, "the same query, only the token added")
}

// TestListReadsAMalformedAnswerAsBefore: rows that do not fit the typed
// decode are read leniently, as the SDK's model read them: a row that is
// not an object or has no id is left out, a field of another type reads as
// absent, a tag that is not a string is dropped; the other rows are kept.
func TestListReadsAMalformedAnswerAsBefore(t *testing.T) {
	p, _ := newStubbedProvider(t, answer("",
		stubVM("vm-a", ""),
		`"not a row"`, `42`, `null`, `["id"]`,
		strings.Replace(stubVM("vm-noid", ""), `"id":`, `"idx":`, 1),
		strings.Replace(stubVM("vm-b", ""), `"vmSize":"Standard_D2s_v5"`, `"vmSize":7`, 1),
		strings.Replace(stubVM("vm-c", ""), `"team":"x"`, `"team":{"n":1}`, 1),
		strings.Replace(stubVM("vm-d", ""), `"zones":["2"]`, `"zones":"2"`, 1),
		stubVM("vm-e", `,"image":"not json"`),
	))
	vms, err := p.List(context.Background(), stubSel)
	require.NoError(t, err)
	byName := map[string]provider.VM{}
	for _, vm := range vms {
		byName[vm.Name] = vm
	}
	require.Len(t, byName, 5, "vm-a..e; the non-objects and the row without an id left out: %v", vms)
	assert.Equal(t, "Standard_D2s_v5", byName["vm-a"].InstanceType)
	assert.Empty(t, byName["vm-b"].InstanceType, "a size that is not a string reads as none")
	_, has := byName["vm-c"].Tags["team"]
	assert.False(t, has, "a tag that is not a string is dropped")
	assert.Equal(t, "c1", byName["vm-c"].Tags[provider.TagCluster])
	assert.Equal(t, "westeurope", byName["vm-d"].Zone, "zones that are not an array: the location")
	assert.Empty(t, byName["vm-e"].Image, "an image reference that is not JSON reads as none")
	assert.Equal(t, "p:o:s:1", byName["vm-d"].Image)
}

// TestListRefusesAnAnswerOfAnotherShape: data that is not an array (the
// table format, which caa does not ask for) and a skip token that is not a
// string are errors that say what was wrong, and nothing is listed.
func TestListRefusesAnAnswerOfAnotherShape(t *testing.T) {
	for name, tc := range map[string]struct{ body, want string }{
		"table data":        {`{"data":{"columns":[],"rows":[]},"totalRecords":0}`, "not the objectArray asked for"},
		"string data":       {`{"data":"rows","totalRecords":0}`, "not the objectArray asked for"},
		"numeric skipToken": {`{"data":[],"$skipToken":7}`, "SkipToken"},
		"not JSON":          {`{"data":[`, "unmarshalling"},
	} {
		t.Run(name, func(t *testing.T) {
			p, stub := newStubbedProvider(t, tc.body)
			vms, err := p.List(context.Background(), stubSel)
			require.Error(t, err)
			assert.Nil(t, vms)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "azure list")
			assert.Len(t, stub.sent, 1, "no second page")
		})
	}
	t.Run("empty data", func(t *testing.T) {
		p, _ := newStubbedProvider(t, `{"data":null}`)
		vms, err := p.List(context.Background(), stubSel)
		require.NoError(t, err)
		assert.Empty(t, vms)
	})
}

// TestListClusterReadsAMalformedGroupAsBefore: the cluster listing's VMs
// (arrays in clusterVM's order) read typed when they fit and leniently
// otherwise: an array of another length or not an array is left out, an
// element of another type reads as absent.
func TestListClusterReadsAMalformedGroupAsBefore(t *testing.T) {
	vm := func(name, size string) string {
		return fmt.Sprintf(`["/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/%s",%q,"westeurope",["1"],`+
			`{"caa-managed-by":"caa","caa-cluster":"c1","caa-node":"n1"},"Succeeded","PowerState/running","2026-01-02T03:04:05Z",%s]`, name, name, size)
	}
	count := `{"data":[{"vms":3,"nodes":1}],"totalRecords":1}`
	for name, tc := range map[string]struct {
		groups string
		want   map[string]string // name -> size
	}{
		"typed": {fmt.Sprintf(`{"data":[{"node":"n1","vms":[%s,%s]}],"totalRecords":1}`, vm("a", `"D2"`), vm("b", `"D4"`)),
			map[string]string{"a": "D2", "b": "D4"}},
		"lenient": {fmt.Sprintf(`{"data":[{"node":"n1","vms":[%s,%s,["short"],"x",%s]}],"totalRecords":1}`, vm("a", `"D2"`), vm("b", `5`),
			strings.Replace(vm("c", `"D8"`), `"caa-cluster":"c1"`, `"caa-cluster":"c2"`, 1)),
			map[string]string{"a": "D2", "b": ""}},
	} {
		t.Run(name, func(t *testing.T) {
			p, _ := newStubbedProvider(t, count, tc.groups)
			vms, err := p.ListCluster(context.Background(), "c1")
			require.NoError(t, err)
			got := map[string]string{}
			for _, v := range vms {
				got[v.Name] = v.InstanceType
				assert.Equal(t, "1", v.Zone)
				assert.Equal(t, provider.StateRunning, v.State)
				assert.Equal(t, "n1", v.Tags[provider.TagNode])
			}
			assert.Equal(t, tc.want, got)
		})
	}
	t.Run("count of another shape", func(t *testing.T) {
		p, _ := newStubbedProvider(t, `{"data":[{"vms":"3","nodes":1}],"totalRecords":1}`)
		vms, err := p.ListCluster(context.Background(), "c1")
		require.NoError(t, err, "a count that is not a number reads as none, as before")
		assert.Empty(t, vms)
	})
}

// The image references of a node's VMs are read once per distinct value.
func TestImageRefsReadsEachReferenceOnce(t *testing.T) {
	m := imageRefs{}
	ref, _ := json.Marshal(map[string]string{"id": "/images/x"})
	assert.Equal(t, "/images/x", m.read(string(ref)))
	assert.Equal(t, "/images/x", m.read(string(ref)))
	assert.Len(t, m, 1)
	assert.Empty(t, m.read(""))
	assert.Empty(t, m.read("{"))
}
