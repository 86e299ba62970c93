package ibmcloud_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// wireRig is a provider on a fake VPC whose server the test can ask what
// each create sent.
type wireRig struct {
	p   *ibmcloud.Provider
	c   *cloud.Cloud
	srv *vpcfake.Server
	ctx context.Context
}

func newWireRig(t *testing.T, types []string, opts []vpcfake.Option, edit func(*ibmcloud.Config)) wireRig {
	t.Helper()
	clock := &conformance.Clock{}
	o := conformance.Options(clock)
	o.Types = append(o.Types, types...)
	c := cloud.New(o)
	srv := vpcfake.NewServer(c, append([]vpcfake.Option{vpcfake.WithAPIKey(testAPIKey)}, opts...)...).(*vpcfake.Server)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Setenv(ibmcloud.EnvAPIKey, testAPIKey)
	cfg := testConfig(hs.URL)
	if edit != nil {
		edit(&cfg)
	}
	p, err := ibmcloud.New(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return wireRig{p: p, c: c, srv: srv, ctx: ctx}
}

// TestOrdinaryVMSaysSoOnTheWire: an ordinary VM on a profile that can be
// confidential asks for confidential_compute_mode "disabled" and no secure
// boot in so many words, as upstream's adaptor does, rather than taking
// the profile's defaults (which VPC applies to a field left out); a TDX VM
// asks for tdx with secure boot.
func TestOrdinaryVMSaysSoOnTheWire(t *testing.T) {
	r := newWireRig(t, []string{"bx3dc-2x10"}, nil, nil)
	plain := conformance.Spec(1, "node-a")
	plain.InstanceType = "bx3dc-2x10"
	vm, err := r.p.Create(r.ctx, plain)
	require.NoError(t, err)
	req, ok := r.srv.CreateRequest(vm.ID)
	require.True(t, ok)
	assert.Equal(t, "disabled", req.ConfidentialComputeMode, "confidential_compute_mode sent")
	require.NotNil(t, req.EnableSecureBoot, "enable_secure_boot sent")
	assert.False(t, *req.EnableSecureBoot)

	tdx := conformance.Spec(2, "node-a")
	tdx.InstanceType, tdx.TEE = "bx3dc-2x10", provider.TEETDX
	vm, err = r.p.Create(r.ctx, tdx)
	require.NoError(t, err)
	req, _ = r.srv.CreateRequest(vm.ID)
	assert.Equal(t, "tdx", req.ConfidentialComputeMode)
	require.NotNil(t, req.EnableSecureBoot)
	assert.True(t, *req.EnableSecureBoot)
	assert.Equal(t, provider.TEETDX, vm.TEE)
}

// TestSGXIsNeverMade: IBM's confidential profiles offer TDX as caa's only
// TEE; a spec asking for SGX (an old record, a caller outside the spec
// selection) is refused naming why, before any call, and never made as
// an ordinary VM in its place.
func TestSGXIsNeverMade(t *testing.T) {
	assert.Equal(t, []provider.TEE{provider.TEETDX}, ibmcloud.TEEs("bx3dc-2x10"))
	assert.Empty(t, ibmcloud.TEEs("bx2-2x8"))

	r := newWireRig(t, []string{"bx3dc-2x10"}, nil, nil)
	spec := conformance.Spec(1, "node-a")
	spec.InstanceType, spec.TEE = "bx3dc-2x10", provider.TEESGX
	_, err := r.p.Create(r.ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Contains(t, err.Error(), "not a confidential VM")
	spec.InstanceType, spec.TEE = conformance.TypeSmall, provider.TEETDX
	_, err = r.p.Create(r.ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec, "TDX on a profile without it")
	assert.Zero(t, r.c.Counters()["total"], "refused before any call")
	assert.Empty(t, r.c.Live())
}

// TestUserDataOverIBMsCapIsRefusedBeforeTheCreate: VPC takes at most 64 KiB
// of user data (IBM Cloud docs, "User data"); caa refuses more before any
// call, with both numbers, and sends exactly the cap.
func TestUserDataOverIBMsCapIsRefusedBeforeTheCreate(t *testing.T) {
	r := newWireRig(t, nil, nil, nil)
	spec := conformance.Spec(1, "node-a")
	spec.UserData = []byte(strings.Repeat("a", ibmcloud.MaxUserData+1))
	_, err := r.p.Create(r.ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Contains(t, err.Error(), "65537 bytes")
	assert.Contains(t, err.Error(), "65536")
	assert.Zero(t, r.c.Counters()["total"], "refused before any call")

	spec.UserData = spec.UserData[:ibmcloud.MaxUserData]
	_, err = r.p.Create(r.ctx, spec)
	require.NoError(t, err, "the cap itself is taken")
}

// TestUserDataLimitIsIBMs: the sandbox learns IBM's cap from the provider,
// so it drops the pull credentials before the create would be refused.
func TestUserDataLimitIsIBMs(t *testing.T) {
	var p provider.Provider = &ibmcloud.Provider{}
	assert.Equal(t, 64<<10, provider.UserDataLimitOf(p))
}
