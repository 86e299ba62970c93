package vpcfake_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

func TestIAMToken(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name   string
		form   url.Values
		status int
		code   string
	}{
		{"wrong key", url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {"nope"}}, 400, "BXNIM0415E"},
		{"no key", url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}}, 400, "BXNIM0109E"},
		{"no grant", url.Values{"apikey": {apiKey}}, 400, "BXNIM0109E"},
		{"other grant", url.Values{"grant_type": {"password"}, "apikey": {apiKey}}, 400, "BXNIM0104E"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.iam(tc.form)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.code, body["errorCode"])
			assert.NotContains(t, body["errorMessage"], apiKey)
		})
	}
	status, body := e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "Bearer", body["token_type"])
	assert.InDelta(t, float64(time.Now().Add(time.Hour).Unix()), body["expiration"], 60)
	assert.Equal(t, int64(6), e.cloud.Counters()[vpcfake.OpIAMToken], "every token call counted, newEnv's too")
}

func TestEveryCallIsCheckedBeforeItRuns(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name, method, path string
		auth               string
		status             int
		code               string
	}{
		{"no token", "GET", "/v1/instances" + version, "", 401, "not_authorized"},
		{"unknown token", "GET", "/v1/instances" + version, "Bearer forged", 401, "not_authorized"},
		{"no version", "GET", "/v1/instances?generation=2", "ok", 400, "missing_version"},
		{"bad version", "GET", "/v1/instances?version=26-8-18&generation=2", "ok", 400, "invalid_version"},
		{"old version", "GET", "/v1/instances?version=2018-01-01&generation=2", "ok", 400, "invalid_version_range"},
		{"no generation", "GET", "/v1/instances?version=2026-08-18", "ok", 400, "missing_generation_parameter"},
		{"generation 1", "GET", "/v1/instances?version=2026-08-18&generation=1", "ok", 400, "invalid_generation_parameter"},
		{"unknown filter", "GET", "/v1/instances" + version + "&dedicated_host.id=x", "ok", 400, "invalid_query_parameter"},
		{"limit too big", "GET", "/v1/instances" + version + "&limit=101", "ok", 400, "bad_field"},
		{"limit zero", "GET", "/v1/instances" + version + "&limit=0", "ok", 400, "bad_field"},
		{"bad start", "GET", "/v1/instances" + version + "&start=zz", "ok", 400, "invalid_id_format"},
		{"unknown route", "GET", "/v1/floating_ips" + version, "ok", 404, "invalid_route"},
		{"missing instance", "GET", "/v1/instances/0717_nope" + version, "ok", 404, "not_found"},
		{"missing volume", "GET", "/v1/volumes/r006-nope" + version, "ok", 404, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			auth := tc.auth
			if auth == "ok" {
				auth = "Bearer " + e.token
			}
			status, body, _ := e.raw(tc.method, tc.path, nil, auth)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.code, code(body), "%v", body)
			assert.NotEmpty(t, body["trace"])
		})
	}
}

func TestCreateRefusesMalformedPrototypes(t *testing.T) {
	e := newEnv(t)
	edit := func(f func(p map[string]any)) map[string]any {
		p := prototype("vm-a", "a:b")
		f(p)
		return p
	}
	vni := func(p map[string]any) map[string]any {
		return p["primary_network_attachment"].(map[string]any)["virtual_network_interface"].(map[string]any)
	}
	vol := func(p map[string]any) map[string]any {
		return p["boot_volume_attachment"].(map[string]any)["volume"].(map[string]any)
	}
	tests := []struct {
		name   string
		body   any
		status int
		code   string
		target string
	}{
		{"not JSON", "{", 400, "bad_request", ""},
		{"two objects", `{"name":"a"}{}`, 400, "bad_request", ""},
		{"wrong type", `{"name":7}`, 400, "bad_request", ""},
		{"unknown field", edit(func(p map[string]any) { p["colour"] = "red" }), 400, "invalid_request_field", "colour"},
		{"image by crn", edit(func(p map[string]any) { p["image"] = map[string]any{"crn": "crn:x"} }), 400, "invalid_request_field", "crn"},
		{"no image", edit(func(p map[string]any) { delete(p, "image") }), 400, "validation_required_field", "image.id"},
		{"no zone", edit(func(p map[string]any) { delete(p, "zone") }), 400, "validation_required_field", "zone.name"},
		{"no profile", edit(func(p map[string]any) { p["profile"] = map[string]any{} }), 400, "validation_required_field", "profile.name"},
		{"bad name", edit(func(p map[string]any) { p["name"] = "Caps_Not_Allowed" }), 400, "bad_field", "name"},
		{"long name", edit(func(p map[string]any) { p["name"] = "a" + strings.Repeat("b", 63) }), 400, "bad_field", "name"},
		{"no network", edit(func(p map[string]any) { delete(p, "primary_network_attachment") }), 400, "validation_required_field", "primary_network_attachment"},
		{"both networks", edit(func(p map[string]any) {
			p["primary_network_interface"] = map[string]any{"subnet": map[string]any{"id": "s"}}
		}), 400, "bad_field", "primary_network_interface"},
		{"no subnet", edit(func(p map[string]any) { delete(vni(p), "subnet") }), 400, "validation_required_field", "subnet.id"},
		{"empty security group", edit(func(p map[string]any) { vni(p)["security_groups"] = []any{map[string]any{}} }), 400, "validation_required_field", "security_groups[0].id"},
		{"no volume profile", edit(func(p map[string]any) { delete(vol(p), "profile") }), 400, "validation_required_field", "boot_volume_attachment.volume.profile"},
		{"tiny volume", edit(func(p map[string]any) { vol(p)["capacity"] = 5 }), 400, "bad_field", "boot_volume_attachment.volume.capacity"},
		{"slash in tag", edit(func(p map[string]any) { vol(p)["user_tags"] = []string{"pod:ns/name"} }), 400, "bad_field", "boot_volume_attachment.volume.user_tags"},
		{"long tag", edit(func(p map[string]any) { vol(p)["user_tags"] = []string{strings.Repeat("t", 129)} }), 400, "bad_field", "boot_volume_attachment.volume.user_tags"},
		{"user data too big", edit(func(p map[string]any) { p["user_data"] = strings.Repeat("x", 64<<10+1) }), 400, "bad_field", "user_data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body, _ := e.call("POST", "/v1/instances"+version, tc.body)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.code, code(body), "%v", body)
			if tc.target != "" {
				errs := body["errors"].([]any)
				assert.Equal(t, tc.target, str(errs[0].(map[string]any), "target", "name"))
			}
			assert.NotContains(t, body, "user_data", "an error never echoes the request")
		})
	}
	assert.Empty(t, e.cloud.Instances(), "no refused create made an instance")
	assert.Empty(t, e.cloud.Resources(""), "nor a side resource")

	status, body, _ := e.raw("POST", "/v1/instances"+version, nil, "Bearer "+e.token)
	assert.Equal(t, http.StatusUnsupportedMediaType, status)
	assert.Equal(t, "unsupported_media_type", code(body))
}

func TestCreateGetDelete(t *testing.T) {
	e := newEnv(t)
	status, in, _ := e.call("POST", "/v1/instances"+version, prototype("vm-a", "Caa-Key:K1", "plain"))
	require.Equal(t, http.StatusCreated, status, "%v", in)
	id := in["id"].(string)
	assert.Equal(t, "vm-a", in["name"])
	assert.Equal(t, "running", in["status"])
	assert.Equal(t, profile, str(in, "profile", "name"))
	assert.Equal(t, image, str(in, "image", "id"))
	assert.Equal(t, "us-south-1", str(in, "zone", "name"))
	assert.Equal(t, "r006-vpc-a", str(in, "vpc", "id"))
	assert.Equal(t, "0717-subnet-a", str(in, "primary_network_attachment", "subnet", "id"))
	assert.NotEmpty(t, str(in, "primary_network_attachment", "primary_ip", "address"))
	assert.Equal(t, float64(8), in["memory"])
	volID := str(in, "boot_volume_attachment", "volume", "id")
	require.NotEmpty(t, volID)

	live := e.cloud.Live()
	require.Len(t, live, 1)
	// The core's views drop the user data itself; its length is kept.
	assert.Equal(t, len("#cloud-config\n"), live[0].UserDataLen)
	kinds := []string{}
	for _, r := range e.cloud.Resources("") {
		kinds = append(kinds, r.Kind)
	}
	assert.ElementsMatch(t, []string{vpcfake.KindVNI, vpcfake.KindVolume}, kinds)

	status, got, _ := e.call("GET", "/v1/instances/"+id+version, nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, in, got, "get shows what create answered")

	status, v, _ := e.call("GET", "/v1/volumes/"+volID+version, nil)
	require.Equal(t, http.StatusOK, status)
	assert.ElementsMatch(t, []any{"caa-key:k1", "plain"}, v["user_tags"], "tags are kept lower case")
	assert.Equal(t, "attached", v["attachment_state"])
	atts := v["volume_attachments"].([]any)
	require.Len(t, atts, 1)
	assert.Equal(t, id, str(atts[0].(map[string]any), "instance", "id"))
	assert.Equal(t, "boot", atts[0].(map[string]any)["type"])

	status, body, _ := e.call("DELETE", "/v1/volumes/"+volID+version, nil)
	assert.Equal(t, http.StatusConflict, status, "an attached volume stays")
	assert.Equal(t, "volume_in_use", code(body))

	status, _, _ = e.call("DELETE", "/v1/instances/"+id+version, nil)
	assert.Equal(t, http.StatusNoContent, status)
	assert.Empty(t, e.cloud.Resources(""), "boot volume and VNI went with it")
	for _, path := range []string{"/v1/instances/" + id, "/v1/volumes/" + volID} {
		status, body, _ = e.call("GET", path+version, nil)
		assert.Equal(t, http.StatusNotFound, status, path)
		assert.Equal(t, "not_found", code(body))
	}
	status, body, _ = e.call("DELETE", "/v1/instances/"+id+version, nil)
	assert.Equal(t, http.StatusNotFound, status, "a second delete is 404")
	assert.Equal(t, "not_found", code(body))

	c := e.cloud.Counters()
	assert.Equal(t, int64(1), c[cloud.OpCreate])
	assert.Equal(t, int64(2), c[cloud.OpGet])
	assert.Equal(t, int64(2), c[cloud.OpDelete])
	assert.Equal(t, int64(2), c[vpcfake.OpVolumeGet])
	assert.Equal(t, int64(1), c[vpcfake.OpVolumeDelete])
}

func TestKeptVolumesAndLegacyInterfaces(t *testing.T) {
	e := newEnv(t)
	p := prototype("vm-b")
	delete(p, "primary_network_attachment")
	p["primary_network_interface"] = map[string]any{"subnet": map[string]any{"id": "0717-subnet-b"}}
	p["boot_volume_attachment"].(map[string]any)["delete_volume_on_instance_delete"] = false
	status, in, _ := e.call("POST", "/v1/instances"+version, p)
	require.Equal(t, http.StatusCreated, status, "%v", in)
	assert.Equal(t, "0717-subnet-b", str(in, "primary_network_interface", "subnet", "id"))
	assert.Nil(t, in["primary_network_attachment"])
	volID := str(in, "boot_volume_attachment", "volume", "id")

	status, _, _ = e.call("DELETE", "/v1/instances/"+str(in, "id")+version, nil)
	require.Equal(t, http.StatusNoContent, status)
	left := e.cloud.Resources("")
	require.Len(t, left, 1, "the interface went, the volume stayed")
	assert.Equal(t, vpcfake.KindVolume, left[0].Kind)

	status, v, _ := e.call("GET", "/v1/volumes/"+volID+version, nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "unattached", v["attachment_state"])
	status, _, _ = e.call("DELETE", "/v1/volumes/"+volID+version, nil)
	assert.Equal(t, http.StatusNoContent, status)
	assert.Empty(t, e.cloud.Resources(""))
}

func TestCoreErrorsBecomeVPCErrors(t *testing.T) {
	e := newEnv(t)
	status, _, _ := e.call("POST", "/v1/instances"+version, prototype("taken"))
	require.Equal(t, http.StatusCreated, status)
	badImage := prototype("vm-c")
	badImage["image"] = map[string]any{"id": "img-bad"}
	badProfile := prototype("vm-d")
	badProfile["profile"] = map[string]any{"name": "zz-1x1"}
	tests := []struct {
		name   string
		faults cloud.Faults
		body   map[string]any
		status int
		code   string
	}{
		{"name taken", cloud.Faults{}, prototype("taken"), 400, "validation_unique_failed"},
		{"quota", cloud.Faults{QuotaLimit: 1}, prototype("vm-e"), 400, "over_quota"},
		{"capacity", cloud.Faults{CapacityFailures: 1}, prototype("vm-f"), 409, "insufficient_capacity"},
		{"bad image", cloud.Faults{}, badImage, 404, "not_found"},
		{"bad profile", cloud.Faults{}, badProfile, 404, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.cloud.SetFaults(tc.faults)
			defer e.cloud.SetFaults(cloud.Faults{})
			status, body, _ := e.call("POST", "/v1/instances"+version, tc.body)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.code, code(body), "%v", body)
		})
	}
	assert.Len(t, e.cloud.Live(), 1)
	assert.Len(t, e.cloud.Resources(""), 2, "refused creates left no side resource")
}

func TestFaults(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name       string
		faults     cloud.Faults
		status     int
		code       string
		retryAfter string
	}{
		{"throttled", cloud.Faults{ThrottleEvery: 1, RetryAfter: 6500 * time.Millisecond}, 429, "rate_limit_exceeded", "7"},
		{"throttled without a wait", cloud.Faults{ThrottleEvery: 1}, 429, "rate_limit_exceeded", ""},
		{"server error", cloud.Faults{ServerErrorRate: 1}, 500, "internal_error", ""},
		{"denied", cloud.Faults{DenyAuth: true}, 401, "not_authorized", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.cloud.SetFaults(tc.faults)
			defer e.cloud.SetFaults(cloud.Faults{})
			e.cloud.ResetCounters()
			status, body, h := e.call("GET", "/v1/instances"+version, nil)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.code, code(body))
			assert.Equal(t, tc.retryAfter, h.Get("Retry-After"))
			assert.Equal(t, int64(1), e.cloud.Counters()[cloud.OpList])
		})
	}
	e.cloud.SetFaults(cloud.Faults{DenyAuth: true})
	status, body := e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	assert.Equal(t, http.StatusBadRequest, status, "IAM refuses the key")
	assert.Equal(t, "BXNIM0415E", body["errorCode"])
	e.cloud.SetFaults(cloud.Faults{ThrottleEvery: 1, RetryAfter: time.Second})
	status, body = e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.NotEmpty(t, body["errorCode"])
}

func TestPaginationAndFilters(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := range 5 {
		p := prototype("vm-"+string(rune('a'+i)), "caa-node:n1")
		if i%2 == 1 {
			p["vpc"] = map[string]any{"id": "r006-vpc-other"}
			p["boot_volume_attachment"].(map[string]any)["volume"].(map[string]any)["user_tags"] = []string{"caa-node:n2"}
		}
		status, in, _ := e.call("POST", "/v1/instances"+version, p)
		require.Equal(t, http.StatusCreated, status)
		ids = append(ids, in["id"].(string))
	}
	// An instance seeded into the core, with its tags on an implicit boot volume.
	seeded, err := e.cloud.Create(cloud.CreateRequest{Name: "seeded", Tags: map[string]string{"caa-node": "n1"}, InstanceType: profile, Image: image})
	require.NoError(t, err)
	ids = append(ids, seeded.ID)
	require.NoError(t, e.cloud.Kill(ids[0]), "a terminated instance is never listed")

	walk := func(collection, path string) ([]string, float64) {
		var got []string
		total := -1.0
		for path != "" {
			status, body, _ := e.call("GET", path, nil)
			require.Equal(t, http.StatusOK, status, "%v", body)
			total = body["total_count"].(float64)
			for _, item := range body[collection].([]any) {
				m := item.(map[string]any)
				if collection == "volumes" {
					atts := m["volume_attachments"].([]any)
					require.Len(t, atts, 1)
					got = append(got, str(atts[0].(map[string]any), "instance", "id"))
				} else {
					got = append(got, m["id"].(string))
				}
			}
			path = ""
			if next := str(body, "next", "href"); next != "" {
				u, err := url.Parse(next)
				require.NoError(t, err)
				assert.NotEmpty(t, u.Query().Get("start"))
				path = u.Path + "?" + u.RawQuery + "&version=2026-08-18&generation=2"
			}
		}
		return got, total
	}
	got, total := walk("instances", "/v1/instances"+version+"&limit=2")
	assert.Equal(t, ids[1:], got, "every live instance, each once, in order")
	assert.Equal(t, float64(5), total)

	got, total = walk("instances", "/v1/instances"+version+"&limit=2&vpc.id=r006-vpc-a")
	assert.Equal(t, []string{ids[2], ids[4]}, got)
	assert.Equal(t, float64(2), total)

	got, _ = walk("instances", "/v1/instances"+version+"&name=vm-c")
	assert.Equal(t, []string{ids[2]}, got)

	got, _ = walk("instances", "/v1/instances"+version+"&vpc.id="+vpcfake.DefaultVPC+"&resource_group.id="+vpcfake.DefaultResourceGroup)
	assert.Equal(t, []string{seeded.ID}, got, "seeded instances show the defaults")

	got, total = walk("volumes", "/v1/volumes"+version+"&limit=1&tag=CAA-NODE:N1")
	assert.Equal(t, []string{ids[2], ids[4], seeded.ID}, got, "tags match without case")
	assert.Equal(t, float64(3), total)

	status, v, _ := e.call("GET", "/v1/volumes/"+seeded.ID+"-boot"+version, nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, []any{"caa-node:n1"}, v["user_tags"])
	status, v, _ = e.call("GET", "/v1/instances/"+seeded.ID+version, nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, seeded.ID+"-boot", str(v, "boot_volume_attachment", "volume", "id"))
	assert.Equal(t, vpcfake.DefaultSubnet, str(v, "primary_network_interface", "subnet", "id"))
}

func TestStatesAndVisibility(t *testing.T) {
	e := newEnv(t)
	e.cloud.SetFaults(cloud.Faults{BootDelay: time.Hour})
	status, in, _ := e.call("POST", "/v1/instances"+version, prototype("vm-s"))
	require.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "pending", in["status"])
	id := in["id"].(string)
	require.NoError(t, e.cloud.Stop(id))
	_, in, _ = e.call("GET", "/v1/instances/"+id+version, nil)
	assert.Equal(t, "stopped", in["status"])
	assert.Equal(t, true, in["startable"])

	e.cloud.SetFaults(cloud.Faults{InvisibleFor: time.Hour})
	status, in, _ = e.call("POST", "/v1/instances"+version, prototype("vm-t"))
	require.Equal(t, http.StatusCreated, status, "create answers with the new instance")
	status, _, _ = e.call("GET", "/v1/instances/"+in["id"].(string)+version, nil)
	assert.Equal(t, http.StatusNotFound, status, "but it is not visible yet")
	status, _, _ = e.call("GET", "/v1/volumes/"+str(in, "boot_volume_attachment", "volume", "id")+version, nil)
	assert.Equal(t, http.StatusNotFound, status, "nor is its volume")
	status, body, _ := e.call("POST", "/v1/instances"+version, prototype("vm-t"))
	assert.Equal(t, http.StatusBadRequest, status, "its name is taken all the same")
	assert.Equal(t, "validation_unique_failed", code(body))
	assert.Len(t, e.cloud.Live(), 2, "one instance of that name")
}

// TestCreateInAnUnknownSubnetNamesTheField: with a known network, a create
// whose subnet the VPC does not have is refused 404 not_found, its target
// naming the prototype's subnet field (what caa reads to tell the node's
// configuration from the pod's spec); nothing is created.
func TestCreateInAnUnknownSubnetNamesTheField(t *testing.T) {
	e := newEnv(t, vpcfake.WithNetwork(vpcfake.Network{Subnets: []string{"0717-subnet-other"}}))
	status, body, _ := e.call("POST", "/v1/instances"+version, prototype("vm-a", "Caa-Key:K1", "plain"))
	require.Equal(t, http.StatusNotFound, status, "%v", body)
	first := body["errors"].([]any)[0].(map[string]any)
	assert.Equal(t, "not_found", first["code"])
	assert.Contains(t, first["target"].(map[string]any)["name"], "subnet.id")
	assert.Empty(t, e.cloud.Instances())
}
