package armfake_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	token      = "fake-bearer-token"
	apiVersion = "2026-04-01"
	image      = "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/images/providers/Microsoft.Compute/images/podvm"
	platform   = "Canonical:ubuntu-24_04-lts:server:latest"
	size       = "Standard_D2as_v5"
	group      = "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/" + armfake.DefaultResourceGroup
	vms        = group + "/providers/Microsoft.Compute/virtualMachines"
	nics       = group + "/providers/Microsoft.Network/networkInterfaces"
	subnet     = "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
)

type fake struct {
	t     *testing.T
	cloud *cloud.Cloud
	url   string
}

func newFake(t *testing.T) *fake {
	t.Helper()
	c := cloud.New(cloud.Options{PageSize: 2, Images: []string{image, platform}, Types: []string{size, "Standard_B1s"}})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token)))
	t.Cleanup(srv.Close)
	return &fake{t: t, cloud: c, url: srv.URL}
}

// reply is a decoded response.
type reply struct {
	status int
	header http.Header
	raw    string
	body   map[string]any
}

// code is the ARM error code of the reply, target its target.
func (r reply) code() string   { return str(r.body, "error", "code") }
func (r reply) target() string { return str(r.body, "error", "target") }

// do sends a request with the test token; a path without a query gets the
// api-version. headers are name, value pairs.
func (f *fake) do(method, path string, body any, headers ...string) reply {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(f.t, err)
		rd = bytes.NewReader(b)
	}
	target := path
	if !strings.HasPrefix(path, "http") {
		if !strings.Contains(path, "?") {
			path += "?api-version=" + apiVersion
		}
		target = f.url + path
	}
	req, err := http.NewRequest(method, target, rd)
	require.NoError(f.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	out := reply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 {
		require.NoError(f.t, json.Unmarshal(raw, &out.body), "a JSON body: %s", raw)
	}
	return out
}

// str digs a string out of nested JSON objects (and arrays, by index).
func str(v any, path ...any) string {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return ""
			}
			v = a[k]
		}
	}
	s, _ := v.(string)
	return s
}

func nicBody() map[string]any {
	return map[string]any{"location": "eastus", "tags": map[string]string{"caa-node": "n1"}, "properties": map[string]any{
		"ipConfigurations": []any{map[string]any{"name": "ipconfig1", "properties": map[string]any{
			"subnet": map[string]any{"id": subnet}, "privateIPAllocationMethod": "Dynamic"}}},
	}}
}

const userData = "#cloud-config\nsecret: s3cr3t-value\n"

func vmBody(nic string) map[string]any {
	return map[string]any{
		"location": "eastus",
		"tags":     map[string]string{"caa-node": "n1"},
		"properties": map[string]any{
			"hardwareProfile": map[string]any{"vmSize": size},
			"storageProfile": map[string]any{
				"imageReference": map[string]any{"id": image},
				"osDisk":         map[string]any{"name": "vm1-osdisk", "createOption": "FromImage", "deleteOption": "Delete"},
			},
			"osProfile": map[string]any{
				"computerName": "vm1", "adminUsername": "caa",
				"linuxConfiguration": map[string]any{"disablePasswordAuthentication": true, "ssh": map[string]any{"publicKeys": []any{
					map[string]any{"path": "/home/caa/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAA k"}}}},
			},
			"networkProfile": map[string]any{"networkInterfaces": []any{map[string]any{
				"id": nics + "/" + nic, "properties": map[string]any{"primary": true, "deleteOption": "Delete"}}}},
			"userData": base64.StdEncoding.EncodeToString([]byte(userData)),
		},
	}
}

// edit sets a value at a path of nested objects in a fresh VM body.
func edit(path string, value any) map[string]any {
	body := vmBody("vm1-nic")
	keys := strings.Split(path, ".")
	m := body
	for _, k := range keys[:len(keys)-1] {
		m = m[k].(map[string]any)
	}
	if value == nil {
		delete(m, keys[len(keys)-1])
	} else {
		m[keys[len(keys)-1]] = value
	}
	return body
}

// poll follows an Azure-AsyncOperation header to the operation's status.
func (f *fake) poll(r reply) reply {
	f.t.Helper()
	op := r.header.Get("Azure-AsyncOperation")
	require.NotEmpty(f.t, op, "an operation to poll")
	require.True(f.t, strings.HasPrefix(op, f.url+"/subscriptions/"), "absolute, on the fake: %s", op)
	return f.do(http.MethodGet, op, nil)
}

func TestRequestsAreCheckedBeforeTheResourceProvider(t *testing.T) {
	f := newFake(t)
	tests := []struct {
		name    string
		path    string
		headers []string
		status  int
		code    string
	}{
		{"no token", vms + "/vm1", []string{"Authorization", ""}, 401, "AuthenticationFailed"},
		{"wrong token", vms + "/vm1", []string{"Authorization", "Bearer other"}, 401, "InvalidAuthenticationToken"},
		{"no api-version", vms + "/vm1?x=1", nil, 400, "MissingApiVersionParameter"},
		{"bad api-version", vms + "/vm1?api-version=latest", nil, 400, "InvalidApiVersionParameter"},
		{"other subscription", "/subscriptions/00000000-0000-0000-0000-000000000009/resourceGroups/" + armfake.DefaultResourceGroup +
			"/providers/Microsoft.Compute/virtualMachines/vm1", nil, 404, "SubscriptionNotFound"},
		{"other group", "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/other/providers/Microsoft.Compute/virtualMachines/vm1", nil, 404, "ResourceGroupNotFound"},
		{"no route", group + "/providers/Microsoft.Compute/disks/d1", nil, 404, "InvalidResourceType"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := f.do(http.MethodGet, tc.path, nil, tc.headers...)
			assert.Equal(t, tc.status, r.status, r.raw)
			assert.Equal(t, tc.code, r.code())
			assert.NotContains(t, r.raw, token, "the token is never echoed")
		})
	}
	assert.Equal(t, int64(len(tests)), f.cloud.Counters()["total"], "every request is counted")
}

func TestFaults(t *testing.T) {
	f := newFake(t)
	f.cloud.SetFaults(cloud.Faults{ThrottleEvery: 1, RetryAfter: 2500 * time.Millisecond})
	r := f.do(http.MethodGet, vms, nil)
	assert.Equal(t, 429, r.status)
	assert.Equal(t, "TooManyRequests", r.code())
	assert.Equal(t, "3", r.header.Get("Retry-After"), "whole seconds, rounded up")

	f.cloud.SetFaults(cloud.Faults{ServerErrorRate: 1})
	r = f.do(http.MethodGet, vms+"/vm1", nil)
	assert.Equal(t, 500, r.status)
	assert.Equal(t, "InternalServerError", r.code())

	f.cloud.SetFaults(cloud.Faults{DenyAuth: true})
	r = f.do(http.MethodPut, vms+"/vm1", vmBody("vm1-nic"))
	assert.Equal(t, 403, r.status)
	assert.Equal(t, "AuthorizationFailed", r.code())
	assert.Contains(t, str(r.body, "error", "message"), "Microsoft.Compute/virtualMachines/write")

	c := f.cloud.Counters()
	assert.Equal(t, int64(1), c[cloud.OpList])
	assert.Equal(t, int64(1), c[cloud.OpGet])
	assert.Equal(t, int64(1), c[cloud.OpCreate])
	assert.Equal(t, int64(1), c["throttled"])
	assert.Empty(t, f.cloud.Instances(), "a refused PUT makes nothing")
}

func TestVMLifecycle(t *testing.T) {
	f := newFake(t)
	r := f.do(http.MethodPut, nics+"/vm1-nic", nicBody())
	require.Equal(t, 201, r.status, r.raw)
	assert.Equal(t, "Succeeded", str(f.poll(r).body, "status"))
	assert.Equal(t, 200, f.do(http.MethodPut, nics+"/vm1-nic", nicBody()).status, "a second PUT replaces")

	r = f.do(http.MethodPut, vms+"/vm1", vmBody("vm1-nic"), "If-None-Match", "*")
	require.Equal(t, 201, r.status, r.raw)
	assert.Equal(t, "Creating", str(r.body, "properties", "provisioningState"))
	assert.Equal(t, vms+"/vm1", str(r.body, "id"))
	assert.Equal(t, "Succeeded", str(f.poll(r).body, "status"))
	in := f.cloud.Live()
	require.Len(t, in, 1)
	assert.Equal(t, len(userData), in[0].UserDataLen)
	assert.Equal(t, image, in[0].Image)

	r = f.do(http.MethodGet, vms+"/vm1?api-version="+apiVersion+"&$expand=instanceView", nil)
	require.Equal(t, 200, r.status, r.raw)
	assert.Equal(t, "Succeeded", str(r.body, "properties", "provisioningState"))
	assert.Equal(t, "PowerState/running", str(r.body, "properties", "instanceView", "statuses", 1, "code"))
	assert.Equal(t, image, str(r.body, "properties", "storageProfile", "imageReference", "id"))
	assert.Equal(t, "Delete", str(r.body, "properties", "networkProfile", "networkInterfaces", 0, "properties", "deleteOption"))
	assert.NotContains(t, r.raw, "customData", "ARM never shows custom data")
	assert.NotContains(t, r.raw, base64.StdEncoding.EncodeToString([]byte(userData)))
	assert.Empty(t, str(r.body, "properties", "instanceView", "statuses", 2, "code"))

	r = f.do(http.MethodGet, nics+"/vm1-nic", nil)
	assert.Equal(t, in[0].IPs[0], str(r.body, "properties", "ipConfigurations", 0, "properties", "privateIPAddress"))
	assert.Equal(t, vms+"/vm1", str(r.body, "properties", "virtualMachine", "id"))

	assert.Equal(t, 200, f.do(http.MethodPut, vms+"/vm1", vmBody("vm1-nic")).status, "an identical PUT is a no-op update")
	r = f.do(http.MethodPut, vms+"/vm1", vmBody("vm1-nic"), "If-None-Match", "*")
	assert.Equal(t, 412, r.status)
	assert.Equal(t, "PreconditionFailed", r.code())
	r = f.do(http.MethodPut, vms+"/VM1", edit("properties.hardwareProfile.vmSize", "Standard_B1s"))
	assert.Equal(t, 409, r.status, "names are case-insensitive: %s", r.raw)
	assert.Equal(t, "PropertyChangeNotAllowed", r.code())
	r = f.do(http.MethodDelete, nics+"/vm1-nic", nil)
	assert.Equal(t, 400, r.status)
	assert.Equal(t, "NicInUse", r.code())
	assert.Len(t, f.cloud.Live(), 1)
	assert.Len(t, f.cloud.Resources(""), 2, "the NIC and the OS disk")

	r = f.do(http.MethodDelete, vms+"/vm1", nil)
	require.Equal(t, 202, r.status, r.raw)
	assert.Equal(t, "Succeeded", str(f.poll(r).body, "status"))
	r = f.do(http.MethodGet, vms+"/vm1", nil)
	assert.Equal(t, 404, r.status)
	assert.Equal(t, "ResourceNotFound", r.code())
	assert.Empty(t, f.cloud.Resources(""), "the NIC and disk went with the VM (deleteOption Delete)")
	assert.Equal(t, 204, f.do(http.MethodDelete, vms+"/vm1", nil).status, "deleting what is gone")
	assert.Equal(t, 204, f.do(http.MethodDelete, nics+"/vm1-nic", nil).status)
	r = f.do(http.MethodGet, nics+"/vm1-nic", nil)
	assert.Equal(t, 404, r.status)
	assert.Equal(t, "NotFound", r.code(), "the network RP's code")
}

func TestDetachedResourcesOutliveTheVM(t *testing.T) {
	f := newFake(t)
	require.Equal(t, 201, f.do(http.MethodPut, nics+"/vm1-nic", nicBody()).status)
	body := edit("properties.storageProfile.osDisk.deleteOption", "Detach")
	body["properties"].(map[string]any)["networkProfile"].(map[string]any)["networkInterfaces"].([]any)[0].(map[string]any)["properties"] =
		map[string]any{"primary": true}
	require.Equal(t, 201, f.do(http.MethodPut, vms+"/vm1", body).status)
	require.Equal(t, 202, f.do(http.MethodDelete, vms+"/vm1", nil).status)
	res := f.cloud.Resources("")
	require.Len(t, res, 2, "NIC and disk stay")
	for _, r := range res {
		assert.Empty(t, r.Owner, "%s is detached", r.Name)
	}
	assert.Equal(t, 202, f.do(http.MethodDelete, nics+"/vm1-nic", nil).status, "a detached NIC can be deleted")
}

func TestVMValidation(t *testing.T) {
	f := newFake(t)
	require.Equal(t, 201, f.do(http.MethodPut, nics+"/vm1-nic", nicBody()).status)
	badData := "!!not-base64-" + userData
	tests := []struct {
		name   string
		path   string
		body   map[string]any
		status int
		code   string
		target string
	}{
		{"unknown member", "vm1", edit("properties.licenceType", "x"), 400, "InvalidRequestContent", "licenceType"},
		{"no location", "vm1", edit("location", nil), 400, "InvalidParameter", "location"},
		{"other location", "vm1", edit("location", "westus"), 400, "LocationNotAvailableForResourceType", ""},
		{"no size", "vm1", edit("properties.hardwareProfile", nil), 400, "InvalidParameter", "hardwareProfile.vmSize"},
		{"two image forms", "vm1", edit("properties.storageProfile.imageReference", map[string]any{"id": image, "publisher": "Canonical"}), 400, "InvalidParameter", "imageReference"},
		{"half a platform image", "vm1", edit("properties.storageProfile.imageReference", map[string]any{"publisher": "Canonical", "offer": "o"}), 400, "InvalidParameter", "imageReference"},
		{"custom data not base64", "vm1", edit("properties.osProfile.customData", badData), 400, "InvalidParameter", "customData"},
		{"user data not base64", "vm1", edit("properties.userData", badData), 400, "InvalidParameter", "userData"},
		{"user data over 64 KB in base64", "vm1", edit("properties.userData", base64.StdEncoding.EncodeToString(make([]byte, 49153))), 400, "InvalidParameter", "userData"},
		{"custom data too large", "vm1", edit("properties.osProfile.customData", base64.StdEncoding.EncodeToString(make([]byte, 65536))), 400, "InvalidParameter", "customData"},
		{"key elsewhere", "vm1", edit("properties.osProfile.linuxConfiguration.ssh", map[string]any{"publicKeys": []any{
			map[string]any{"path": "/root/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAA k"}}}), 400, "InvalidParameter", "linuxConfiguration.ssh.publicKeys.path"},
		{"no key, no password", "vm1", edit("properties.osProfile.linuxConfiguration.ssh", nil), 400, "InvalidParameter", "linuxConfiguration.ssh.publicKeys"},
		{"bad computer name", "vm1", edit("properties.osProfile.computerName", "-vm_1"), 400, "InvalidParameter", "osProfile.computerName"},
		{"no NIC", "vm1", edit("properties.networkProfile.networkInterfaces", []any{}), 400, "InvalidParameter", "networkProfile"},
		{"a NIC id that is not one", "vm1", edit("properties.networkProfile.networkInterfaces", []any{map[string]any{"id": subnet}}), 400, "InvalidResourceReference", "networkProfile.networkInterfaces"},
		{"a NIC that does not exist", "vm1", edit("properties.networkProfile.networkInterfaces", []any{map[string]any{"id": nics + "/nope"}}), 400, "InvalidResourceReference", "networkProfile"},
		{"bad disk deleteOption", "vm1", edit("properties.storageProfile.osDisk.deleteOption", "Keep"), 400, "InvalidParameter", "osDisk.deleteOption"},
		{"zone 4", "vm1", edit("zones", []string{"4"}), 400, "InvalidParameter", "zones"},
		{"tag name with a slash", "vm1", edit("tags", map[string]string{"caa/node": "x"}), 400, "InvalidParameter", "tags"},
		{"tag value too long", "vm1", edit("tags", map[string]string{"k": strings.Repeat("v", 257)}), 400, "InvalidParameter", "tags"},
		{"name ending in a hyphen", "vm1-", vmBody("vm1-nic"), 400, "InvalidResourceName", ""},
		{"name too long", strings.Repeat("v", 65), vmBody("vm1-nic"), 400, "InvalidResourceName", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := f.do(http.MethodPut, vms+"/"+tc.path, tc.body)
			assert.Equal(t, tc.status, r.status, r.raw)
			assert.Equal(t, tc.code, r.code(), r.raw)
			assert.Equal(t, tc.target, r.target(), r.raw)
			assert.NotContains(t, r.raw, "s3cr3t", "user data never echoes back")
		})
	}
	assert.Empty(t, f.cloud.Instances(), "no refused PUT made a VM")
	assert.Len(t, f.cloud.Resources(""), 1, "nor left a disk")
}

func TestCoreErrorsAsARMCodes(t *testing.T) {
	f := newFake(t)
	require.Equal(t, 201, f.do(http.MethodPut, nics+"/vm1-nic", nicBody()).status)
	platformRef := map[string]any{"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "1.0"}
	fillQuota := func() {
		_, err := f.cloud.Create(cloud.CreateRequest{Name: "other", Image: image, InstanceType: size})
		require.NoError(t, err)
	}
	tests := []struct {
		name   string
		setup  func()
		faults cloud.Faults
		body   map[string]any
		status int
		code   string
		target string
	}{
		{"unknown image id", func() {}, cloud.Faults{}, edit("properties.storageProfile.imageReference", map[string]any{"id": image + "-x"}), 400, "InvalidParameter", "imageReference"},
		{"unknown platform image", func() {}, cloud.Faults{}, edit("properties.storageProfile.imageReference", platformRef), 404, "ImageNotFound", ""},
		{"unknown size", func() {}, cloud.Faults{}, edit("properties.hardwareProfile.vmSize", "Standard_Z9"), 400, "InvalidParameter", "vmSize"},
		{"quota", fillQuota, cloud.Faults{QuotaLimit: 1}, vmBody("vm1-nic"), 409, "OperationNotAllowed", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			f.cloud.SetFaults(tc.faults)
			defer f.cloud.SetFaults(cloud.Faults{})
			r := f.do(http.MethodPut, vms+"/vm1", tc.body)
			assert.Equal(t, tc.status, r.status, r.raw)
			assert.Equal(t, tc.code, r.code())
			assert.Equal(t, tc.target, r.target())
		})
	}
	assert.Len(t, f.cloud.Resources(""), 1, "no refused PUT left a disk")
}

func TestAllocationFailsInTheOperation(t *testing.T) {
	f := newFake(t)
	require.Equal(t, 201, f.do(http.MethodPut, nics+"/vm1-nic", nicBody()).status)
	f.cloud.SetFaults(cloud.Faults{CapacityFailures: 1})
	r := f.do(http.MethodPut, vms+"/vm1", vmBody("vm1-nic"))
	require.Equal(t, 201, r.status, "accepted: %s", r.raw)
	op := f.poll(r)
	assert.Equal(t, 200, op.status)
	assert.Equal(t, "Failed", str(op.body, "status"))
	assert.Equal(t, "AllocationFailed", str(op.body, "error", "code"))
	assert.Equal(t, 404, f.do(http.MethodGet, vms+"/vm1", nil).status)
	assert.Len(t, f.cloud.Resources(""), 1, "only the NIC: the disk made for the VM is gone")
	assert.Empty(t, f.cloud.Instances())
}

func TestListsPageWithNextLink(t *testing.T) {
	f := newFake(t)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		_, err := f.cloud.Create(cloud.CreateRequest{Name: n, Image: platform, InstanceType: size})
		require.NoError(t, err)
	}
	var names []string
	next, pages := vms, 0
	for next != "" {
		r := f.do(http.MethodGet, next, nil)
		require.Equal(t, 200, r.status, r.raw)
		pages++
		for i := 0; str(r.body, "value", i, "name") != ""; i++ {
			names = append(names, str(r.body, "value", i, "name"))
			assert.Equal(t, "ubuntu-24_04-lts", str(r.body, "value", i, "properties", "storageProfile", "imageReference", "offer"),
				"a platform image shows as publisher, offer, sku, version")
		}
		next = str(r.body, "nextLink")
		if next != "" {
			u, err := url.Parse(next)
			require.NoError(t, err)
			assert.Equal(t, apiVersion, u.Query().Get("api-version"), "a nextLink carries the api-version")
			assert.NotEmpty(t, u.Query().Get("$skiptoken"))
		}
	}
	assert.Equal(t, []string{"a", "b", "c", "d", "e"}, names)
	assert.Equal(t, 3, pages)
	assert.Equal(t, int64(3), f.cloud.Counters()[cloud.OpList])

	r := f.do(http.MethodGet, vms+"?api-version="+apiVersion+"&$expand=userData", nil)
	assert.Equal(t, 400, r.status, "a list expands the instance view only")
	assert.Equal(t, "$expand", r.target())
	r = f.do(http.MethodGet, vms+"?api-version="+apiVersion+"&$skiptoken=zz", nil)
	assert.Equal(t, 400, r.status)
	assert.Equal(t, "$skiptoken", r.target())

	for _, n := range []string{"n1", "n2", "n3"} {
		require.Equal(t, 201, f.do(http.MethodPut, nics+"/"+n, nicBody()).status)
	}
	r = f.do(http.MethodGet, nics, nil)
	assert.Equal(t, nics+"/n1", str(r.body, "value", 0, "id"))
	assert.Equal(t, nics+"/n2", str(r.body, "value", 1, "id"))
	r = f.do(http.MethodGet, str(r.body, "nextLink"), nil)
	assert.Equal(t, nics+"/n3", str(r.body, "value", 0, "id"))
	assert.Empty(t, str(r.body, "nextLink"))
	assert.Equal(t, int64(2), f.cloud.Counters()[armfake.OpNICList])
}

func TestControlsAreMounted(t *testing.T) {
	f := newFake(t)
	resp, err := http.Get(f.url + cloud.ControlPrefix + "counters")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
}

func TestPowerStatesShowInTheInstanceView(t *testing.T) {
	f := newFake(t)
	made := map[string]func(string) error{
		"running": nil, "stopped": f.cloud.Stop, "deallocated": f.cloud.Deallocate, "failed": f.cloud.Fail,
	}
	for _, n := range []string{"running", "stopped", "deallocated", "failed"} {
		in, err := f.cloud.Create(cloud.CreateRequest{Name: n, Image: platform, InstanceType: size})
		require.NoError(t, err)
		if do := made[n]; do != nil {
			require.NoError(t, do(in.ID))
		}
	}
	// provisioning state, then the status codes of the instance view.
	want := map[string][]string{
		"running":     {"Succeeded", "ProvisioningState/succeeded", "PowerState/running"},
		"stopped":     {"Succeeded", "ProvisioningState/succeeded", "PowerState/stopped"},
		"deallocated": {"Succeeded", "ProvisioningState/succeeded", "PowerState/deallocated"},
		// A VM the core failed is not running either (fidelity.go: a
		// Failed VM that runs is an extension failure).
		"failed": {"Failed", "ProvisioningState/failed/InternalOperationError", "PowerState/deallocated"},
	}
	check := func(vm map[string]any, view bool) {
		name := str(vm, "name")
		w := want[name]
		require.NotNil(t, w, "unexpected VM %q", name)
		assert.Equal(t, w[0], str(vm, "properties", "provisioningState"), name)
		if !view {
			assert.Empty(t, str(vm, "properties", "instanceView", "statuses", 0, "code"), "%s: no instance view unless asked", name)
			return
		}
		assert.Equal(t, w[1], str(vm, "properties", "instanceView", "statuses", 0, "code"), name)
		assert.Equal(t, w[2], str(vm, "properties", "instanceView", "statuses", 1, "code"), name)
	}
	for name := range want {
		r := f.do(http.MethodGet, vms+"/"+name+"?api-version="+apiVersion+"&$expand=instanceView", nil)
		require.Equal(t, 200, r.status, r.raw)
		check(r.body, true)
		r = f.do(http.MethodGet, vms+"/"+name, nil)
		check(r.body, false)
	}
	assert.Equal(t, "Error", str(f.do(http.MethodGet, vms+"/failed?api-version="+apiVersion+"&$expand=instanceView", nil).body,
		"properties", "instanceView", "statuses", 0, "level"))

	// The group listing expands the instance view too, on every page: the
	// nextLink keeps the $expand.
	seen := 0
	for next := vms + "?api-version=" + apiVersion + "&$expand=instanceView"; next != ""; {
		r := f.do(http.MethodGet, next, nil)
		require.Equal(t, 200, r.status, r.raw)
		for i := 0; str(r.body, "value", i, "name") != ""; i++ {
			vm, _ := r.body["value"].([]any)[i].(map[string]any)
			check(vm, true)
			seen++
		}
		next = str(r.body, "nextLink")
	}
	assert.Equal(t, 4, seen)
	r := f.do(http.MethodGet, vms, nil)
	vm, _ := r.body["value"].([]any)[0].(map[string]any)
	check(vm, false)
}

func TestAFakeCanRefuseTheExpandedListing(t *testing.T) {
	c := cloud.New(cloud.Options{})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token), armfake.WithoutListInstanceView()))
	t.Cleanup(srv.Close)
	f := &fake{t: t, cloud: c, url: srv.URL}
	r := f.do(http.MethodGet, vms+"?api-version="+apiVersion+"&$expand=instanceView", nil)
	assert.Equal(t, 400, r.status)
	assert.Equal(t, "InvalidParameter", r.code())
	assert.Equal(t, "$expand", r.target())
	assert.Equal(t, 200, f.do(http.MethodGet, vms, nil).status)
}

func TestSlowOperationsRunForSomePollsAndAskForAWait(t *testing.T) {
	c := cloud.New(cloud.Options{Images: []string{image}, Types: []string{size}})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token), armfake.WithSlowOperations(2, 30*time.Millisecond)))
	t.Cleanup(srv.Close)
	f := &fake{t: t, cloud: c, url: srv.URL}
	r := f.do(http.MethodPut, nics+"/vm1-nic", nicBody())
	require.Equal(t, 201, r.status, r.raw)
	assert.Equal(t, "30", r.header.Get("Retry-After-Ms"), "the accepted reply asks for a wait too")
	for range 2 {
		p := f.poll(r)
		assert.Equal(t, "InProgress", str(p.body, "status"))
		assert.Equal(t, "30", p.header.Get("Retry-After-Ms"))
	}
	p := f.poll(r)
	assert.Equal(t, "Succeeded", str(p.body, "status"))
	assert.Empty(t, p.header.Get("Retry-After-Ms"), "a finished operation asks for nothing")
	assert.Equal(t, "Succeeded", str(f.poll(r).body, "status"), "and stays finished")
}
