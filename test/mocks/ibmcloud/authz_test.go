package vpcfake_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

const (
	testProfileID = "Profile-test"
	testIAMID     = "iam-" + testProfileID
	testGroup     = "rg-caa"
)

// policyDoc is a policy file granting role on one resource of the
// trusted profile testProfileID.
func policyDoc(grants ...string) string {
	var b strings.Builder
	b.WriteString(`{"policies":[`)
	for i, g := range grants {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(g)
	}
	b.WriteString(`]}`)
	return b.String()
}

func grant(role string, attrs ...string) string {
	var a []string
	for i := 0; i < len(attrs); i += 2 {
		a = append(a, `{"name":"`+attrs[i]+`","value":"`+attrs[i+1]+`"}`)
	}
	return `{"type":"access","subjects":[{"attributes":[{"name":"iam_id","value":"` + testIAMID + `"}]}],` +
		`"roles":[{"role_id":"crn:v1:bluemix:public:iam::::role:` + role + `"}],` +
		`"resources":[{"attributes":[` + strings.Join(a, ",") + `]}]}`
}

// everythingCaaNeeds is the policy document that grants caa every action
// it takes on the test's subnet, VPC, security group, image and group.
func everythingCaaNeeds() string {
	return policyDoc(
		grant("Editor", "serviceName", "is", "instanceId", "*", "resourceGroupId", vpcfake.DefaultResourceGroup),
		grant("Editor", "serviceName", "is", "volumeId", "*", "resourceGroupId", vpcfake.DefaultResourceGroup),
		grant("Editor", "serviceName", "is", "virtualNetworkInterfaceId", "*", "resourceGroupId", vpcfake.DefaultResourceGroup),
		grant("Operator", "serviceName", "is", "subnetId", "0717-subnet-a"),
		grant("Operator", "serviceName", "is", "vpcId", "r006-vpc-a"),
		grant("Operator", "serviceName", "is", "securityGroupId", "r006-sg-a"),
		grant("Viewer", "serviceName", "is", "imageId", image),
		grant("Viewer", "resourceType", "resource-group", "resource", vpcfake.DefaultResourceGroup),
	)
}

func TestRolesExpandToTheirActions(t *testing.T) {
	for _, tc := range []struct {
		role  string
		allow []string
		deny  []string
	}{
		{"Viewer", []string{"read", "list"}, []string{"operate", "create", "update", "delete"}},
		{"Operator", []string{"read", "list", "operate"}, []string{"create", "update", "delete"}},
		{"Editor", []string{"read", "list", "operate", "create", "update", "delete"}, nil},
		{"Administrator", []string{"read", "list", "operate", "create", "delete"}, nil},
	} {
		t.Run(tc.role, func(t *testing.T) {
			p, err := vpcfake.ParsePolicies([]byte(policyDoc(grant(tc.role, "serviceName", "is", "subnetId", "*"))), nil)
			require.NoError(t, err)
			for _, v := range tc.allow {
				assert.True(t, p.Allows(testIAMID, vpcfake.Access{Type: "subnet", Verb: v, ID: "s1"}), "%s allows %s", tc.role, v)
			}
			for _, v := range tc.deny {
				assert.False(t, p.Allows(testIAMID, vpcfake.Access{Type: "subnet", Verb: v, ID: "s1"}), "%s denies %s", tc.role, v)
			}
		})
	}
}

func TestPolicyScopes(t *testing.T) {
	p, err := vpcfake.ParsePolicies([]byte(policyDoc(
		grant("Editor", "accountId", "a", "serviceName", "is", "instanceId", "*", "resourceGroupId", "REPLACE_ME_GROUP"),
		grant("Operator", "serviceName", "is", "subnetId", "s1"),
		grant("Viewer", "resourceType", "resource-group", "resource", "REPLACE_ME_GROUP"),
	)), map[string]string{"REPLACE_ME_GROUP": testGroup})
	require.NoError(t, err)
	for _, tc := range []struct {
		who   string
		a     vpcfake.Access
		allow bool
	}{
		{testIAMID, vpcfake.Access{Type: "instance", Verb: "create", Group: testGroup}, true},
		{testIAMID, vpcfake.Access{Type: "instance", Verb: "create", Group: "another-group"}, false},
		{"iam-Profile-other", vpcfake.Access{Type: "instance", Verb: "create", Group: testGroup}, false},
		{testIAMID, vpcfake.Access{Type: "volume", Verb: "read", Group: testGroup}, false},
		{testIAMID, vpcfake.Access{Type: "subnet", Verb: "operate", ID: "s1"}, true},
		{testIAMID, vpcfake.Access{Type: "subnet", Verb: "operate", ID: "s2"}, false},
		{testIAMID, vpcfake.Access{Type: "subnet", Verb: "delete", ID: "s1"}, false},
		{testIAMID, vpcfake.Access{Type: "resource-group", Verb: "read", Group: testGroup}, true},
		{testIAMID, vpcfake.Access{Type: "resource-group", Verb: "read", Group: "another-group"}, false},
	} {
		assert.Equal(t, tc.allow, p.Allows(tc.who, tc.a), "%s: %s", tc.who, tc.a)
	}
	assert.Equal(t, "is.instance.instance.create", vpcfake.Access{Type: "instance", Verb: "create"}.Action())
	assert.Equal(t, "resource-controller.group.retrieve", vpcfake.Access{Type: "resource-group"}.Action())

	grants := p.Grants()
	require.Len(t, grants, 3)
	assert.Equal(t, "is.instance.instance.", grants[0].ActionPrefix())
	assert.Equal(t, "resource-controller.group.", grants[2].ActionPrefix())
	without := p.Without(grants[1])
	assert.Len(t, without.Policies, 2)
	assert.False(t, without.Allows(testIAMID, vpcfake.Access{Type: "subnet", Verb: "operate", ID: "s1"}))
	assert.True(t, without.Allows(testIAMID, vpcfake.Access{Type: "instance", Verb: "create", Group: testGroup}))
	assert.True(t, p.Allows(testIAMID, vpcfake.Access{Type: "subnet", Verb: "operate", ID: "s1"}), "Without leaves the original alone")
}

func TestPolicyFilesTheFakeCannotReadAreRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":          `{"policies":[]}`,
		"unknown field":  `{"policies":[],"statement":[]}`,
		"not access":     strings.Replace(policyDoc(grant("Viewer", "serviceName", "is")), `"access"`, `"authorization"`, 1),
		"unknown role":   policyDoc(grant("Writer", "serviceName", "is")),
		"other operator": strings.Replace(policyDoc(grant("Viewer", "serviceName", "is")), `"value":"is"`, `"operator":"stringMatch","value":"is"`, 1),
	} {
		_, err := vpcfake.ParsePolicies([]byte(doc), nil)
		assert.Error(t, err, name)
	}
}

// profileEnv is a fake with a trusted profile, the policies of policy, and
// the network it knows.
type profileEnv struct {
	*env
	profile *vpcfake.TrustedProfile
	srv     *vpcfake.Server
	crToken atomic.Pointer[string]
}

func newProfileEnv(t *testing.T, policy *vpcfake.Policies, lifetime time.Duration) *profileEnv {
	t.Helper()
	c := cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: 3, Images: []string{image}, Types: []string{profile}})
	pe := &profileEnv{}
	pe.profile = &vpcfake.TrustedProfile{ID: testProfileID, Name: "caa", Subject: "system:serviceaccount:caa-system:caa", Lifetime: lifetime,
		Verify: func(tok string) (string, error) {
			switch cur := pe.crToken.Load(); {
			case cur != nil && tok == *cur:
				return "system:serviceaccount:caa-system:caa", nil
			case tok == "token-of-another-sa":
				return "system:serviceaccount:default:other", nil
			}
			return "", errors.New("signature does not verify")
		}}
	pe.srv = vpcfake.NewServer(c, vpcfake.WithTrustedProfile(pe.profile), vpcfake.WithPolicies(func() *vpcfake.Policies { return policy }),
		vpcfake.WithNetwork(vpcfake.Network{VPC: "r006-vpc-a", Subnets: []string{"0717-subnet-a"}, SecurityGroups: []string{"r006-sg-a"}})).(*vpcfake.Server)
	srv := httptest.NewServer(pe.srv)
	t.Cleanup(srv.Close)
	pe.env = &env{t: t, cloud: c, url: srv.URL}
	tok := "cr-token-1"
	pe.crToken.Store(&tok)
	return pe
}

func (pe *profileEnv) exchange(form url.Values) (int, map[string]any) {
	form.Set("grant_type", "urn:ibm:params:oauth:grant-type:cr-token")
	return pe.iam(form)
}

func TestCRTokenExchange(t *testing.T) {
	pe := newProfileEnv(t, nil, time.Hour)
	for name, tc := range map[string]struct {
		form url.Values
		code string
	}{
		"no token":         {url.Values{"profile_id": {testProfileID}}, "BXNIM0109E"},
		"no profile":       {url.Values{"cr_token": {"cr-token-1"}}, "BXNIM0109E"},
		"another profile":  {url.Values{"cr_token": {"cr-token-1"}, "profile_id": {"Profile-other"}}, "BXNIM0513E"},
		"a wrong name":     {url.Values{"cr_token": {"cr-token-1"}, "profile_name": {"other"}}, "BXNIM0513E"},
		"a forged token":   {url.Values{"cr_token": {"forged"}, "profile_id": {testProfileID}}, "BXNIM0467E"},
		"an unlinked SA":   {url.Values{"cr_token": {"token-of-another-sa"}, "profile_id": {testProfileID}}, "BXNIM0468E"},
		"id and bad name":  {url.Values{"cr_token": {"cr-token-1"}, "profile_id": {testProfileID}, "profile_name": {"x"}}, "BXNIM0513E"},
		"no grant at all!": {url.Values{"cr_token": {"cr-token-1"}, "profile_id": {testProfileID}, "grant_type": {""}}, "BXNIM0109E"},
	} {
		var status int
		var body map[string]any
		if name == "no grant at all!" {
			status, body = pe.iam(tc.form)
		} else {
			status, body = pe.exchange(tc.form)
		}
		assert.Equal(t, http.StatusBadRequest, status, name)
		assert.Equal(t, tc.code, body["errorCode"], name)
		assert.NotContains(t, body["errorMessage"], "cr-token-1", name)
	}
	assert.Equal(t, int64(7), pe.profile.Refused.Load(), "every refused cr-token request is counted")

	for _, form := range []url.Values{
		{"cr_token": {"cr-token-1"}, "profile_id": {testProfileID}},
		{"cr_token": {"cr-token-1"}, "profile_name": {"caa"}},
	} {
		status, body := pe.exchange(form)
		require.Equal(t, http.StatusOK, status, "%v", body)
		tok := body["access_token"].(string)
		assert.Equal(t, float64(3600), body["expires_in"])
		pe.token = tok
		status, _, _ = pe.call("GET", "/v1/subnets/0717-subnet-a"+version, nil)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, int64(1), pe.srv.Uses(tok))
	}
	assert.Equal(t, int64(2), pe.profile.Issued.Load())
	assert.Len(t, pe.profile.AccessTokens(), 2)
}

func TestAccessTokensExpireAndAreRevoked(t *testing.T) {
	pe := newProfileEnv(t, nil, time.Second)
	status, body := pe.exchange(url.Values{"cr_token": {"cr-token-1"}, "profile_id": {testProfileID}})
	require.Equal(t, http.StatusOK, status)
	pe.token = body["access_token"].(string)
	status, _, _ = pe.call("GET", "/v1/vpcs/r006-vpc-a"+version, nil)
	require.Equal(t, http.StatusOK, status)
	// The token's expiry is the wall clock's: wait for it by polling.
	require.Eventually(t, func() bool {
		status, _, _ := pe.call("GET", "/v1/vpcs/r006-vpc-a"+version, nil)
		return status == http.StatusUnauthorized
	}, 10*time.Second, 50*time.Millisecond, "an expired access token is refused")

	pe2 := newProfileEnv(t, nil, time.Hour)
	_, body = pe2.exchange(url.Values{"cr_token": {"cr-token-1"}, "profile_id": {testProfileID}})
	pe2.token = body["access_token"].(string)
	status, _, _ = pe2.call("GET", "/v1/vpcs/r006-vpc-a"+version, nil)
	require.Equal(t, http.StatusOK, status)
	pe2.srv.Revoke(pe2.token)
	status, body, _ = pe2.call("GET", "/v1/vpcs/r006-vpc-a"+version, nil)
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, "not_authorized", code(body))
}

// TestPoliciesGateEveryRoute: with a policy that grants nothing a route
// needs, each answers 403 forbidden naming the action; with the grants,
// the same calls pass; listings and search leave out what the caller may
// not read.
func TestPoliciesGateEveryRoute(t *testing.T) {
	full, err := vpcfake.ParsePolicies([]byte(everythingCaaNeeds()), nil)
	require.NoError(t, err)
	var policy atomic.Pointer[vpcfake.Policies]
	policy.Store(full)
	c := cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: 3, Images: []string{image}, Types: []string{profile}})
	tok := "cr-token-1"
	prof := &vpcfake.TrustedProfile{ID: testProfileID, Verify: func(s string) (string, error) {
		if s != tok {
			return "", errors.New("bad")
		}
		return "sa", nil
	}}
	srv := httptest.NewServer(vpcfake.NewServer(c, vpcfake.WithTrustedProfile(prof), vpcfake.WithPolicies(policy.Load)))
	t.Cleanup(srv.Close)
	e := &env{t: t, cloud: c, url: srv.URL}
	status, body := e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:cr-token"}, "cr_token": {tok}, "profile_id": {testProfileID}})
	require.Equal(t, http.StatusOK, status)
	e.token = body["access_token"].(string)

	status, in, _ := e.call("POST", "/v1/instances"+version, prototype("vm-a", "caa-node:n1"))
	require.Equal(t, http.StatusCreated, status, "%v", in)
	id, vol := in["id"].(string), str(in, "boot_volume_attachment", "volume", "id")
	search := func() int {
		status, body, _ := e.call("POST", "/v3/resources/search", map[string]any{"query": "tags:\"caa-node:n1\"", "fields": []string{"crn"}})
		require.Equal(t, http.StatusOK, status, "%v", body)
		return len(body["items"].([]any))
	}
	require.Equal(t, 1, search())

	calls := map[string]struct {
		method, path, action string
		body                 any
	}{
		"create":         {"POST", "/v1/instances", "is.instance.instance.create", prototype("vm-b")},
		"get":            {"GET", "/v1/instances/" + id, "is.instance.instance.read", nil},
		"list":           {"GET", "/v1/instances", "is.instance.instance.list", nil},
		"volume get":     {"GET", "/v1/volumes/" + vol, "is.volume.volume.read", nil},
		"volume list":    {"GET", "/v1/volumes", "is.volume.volume.list", nil},
		"subnet":         {"GET", "/v1/subnets/0717-subnet-a", "is.subnet.subnet.read", nil},
		"vpc":            {"GET", "/v1/vpcs/r006-vpc-a", "is.vpc.vpc.read", nil},
		"security group": {"GET", "/v1/security_groups/r006-sg-a", "is.security-group.security-group.read", nil},
		"image":          {"GET", "/v1/images/" + image, "is.image.image.read", nil},
		"delete":         {"DELETE", "/v1/instances/" + id, "is.instance.instance.delete", nil},
	}
	policy.Store(&vpcfake.Policies{}) // grants nothing
	for name, c := range calls {
		status, body, _ := e.call(c.method, c.path+version, c.body)
		assert.Equal(t, http.StatusForbidden, status, name)
		assert.Equal(t, "forbidden", code(body), name)
		msg, _ := body["errors"].([]any)[0].(map[string]any)["message"].(string)
		assert.Contains(t, msg, c.action, name)
		assert.Contains(t, msg, testIAMID, name)
	}
	assert.Zero(t, search(), "search shows nothing the caller may not read")
	assert.Len(t, e.cloud.Live(), 1, "nothing was made or deleted")

	policy.Store(full)
	for _, name := range []string{"get", "list", "volume get", "volume list", "subnet", "vpc", "security group", "image", "delete"} {
		c := calls[name]
		status, body, _ := e.call(c.method, c.path+version, c.body)
		assert.Less(t, status, 300, "%s: %v", name, body)
	}
	assert.Empty(t, e.cloud.Live())
}

// TestCreateNeedsEveryAttachment: the create needs operate on the subnet,
// each security group and the VPC it names, read on the image, create on
// the boot volume and network interface, and Viewer on the group.
func TestCreateNeedsEveryAttachment(t *testing.T) {
	p, err := vpcfake.ParsePolicies([]byte(everythingCaaNeeds()), nil)
	require.NoError(t, err)
	for _, g := range p.Grants() {
		pe := newProfileEnv(t, p.Without(g), time.Hour)
		_, body := pe.exchange(url.Values{"cr_token": {"cr-token-1"}, "profile_id": {testProfileID}})
		pe.token = body["access_token"].(string)
		status, body, _ := pe.call("POST", "/v1/instances"+version, prototype("vm-a"))
		assert.Equal(t, http.StatusForbidden, status, "without %s", g)
		msg, _ := body["errors"].([]any)[0].(map[string]any)["message"].(string)
		assert.Contains(t, msg, g.ActionPrefix(), "without %s", g)
		assert.Empty(t, pe.cloud.Instances(), "without %s nothing is made", g)
		assert.Empty(t, pe.cloud.Resources(""), "without %s no side resource is left", g)
	}
}
