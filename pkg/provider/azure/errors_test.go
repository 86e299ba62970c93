package azure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

// responseError is the SDK's error for an ARM reply.
func responseError(status int, body string, header http.Header) error {
	req, _ := http.NewRequest(http.MethodGet, "https://management.azure.com/subscriptions/s/resourceGroups/g", nil)
	if header == nil {
		header = http.Header{}
	}
	return runtime.NewResponseError(&http.Response{
		StatusCode: status, Status: http.StatusText(status), Header: header, Request: req,
		Body: io.NopCloser(strings.NewReader(body)),
	})
}

func armBody(code, message, target string) string {
	return fmt.Sprintf(`{"error":{"code":%q,"message":%q,"target":%q}}`, code, message, target)
}

func TestClassify(t *testing.T) {
	retry7 := http.Header{"Retry-After": {"7"}}
	tests := []struct {
		name       string
		op         string
		status     int
		body       string
		header     http.Header
		kind       error // nil: transient
		code       string
		retryAfter time.Duration
	}{
		{"ARM throttling", opGet, 429, armBody("TooManyRequests", "throttled", ""), retry7, provider.ErrThrottled, "TooManyRequests", 7 * time.Second},
		{"compute throttling", opCreate, 429, armBody("OperationNotAllowed", "too many requests for this subscription", ""),
			http.Header{"X-Ms-Retry-After-Ms": {"1500"}}, provider.ErrThrottled, "OperationNotAllowed", 1500 * time.Millisecond},
		{"throttling without a body", opList, 429, "", nil, provider.ErrThrottled, "", 0},
		{"quota as OperationNotAllowed", opCreate, 409, armBody("OperationNotAllowed", "Operation could not be completed as it results in exceeding approved standardDSv3Family Cores quota.", ""), nil, provider.ErrQuota, "OperationNotAllowed", 0},
		{"QuotaExceeded", opCreate, 409, armBody("QuotaExceeded", "too many", ""), nil, provider.ErrQuota, "QuotaExceeded", 0},
		{"OperationNotAllowed on a VM being deleted", opDelete, 409, armBody("OperationNotAllowed", "Operation is not allowed since the VM is marked for deletion.", ""), nil, provider.ErrConflict, "OperationNotAllowed", 0},
		{"AllocationFailed from the operation", opCreate, 200, `{"status":"Failed",` + armBody("AllocationFailed", "no capacity", "")[1:], nil, provider.ErrCapacity, "AllocationFailed", 0},
		{"ZonalAllocationFailed", opCreate, 409, armBody("ZonalAllocationFailed", "zone full", ""), nil, provider.ErrCapacity, "ZonalAllocationFailed", 0},
		{"SkuNotAvailable", opCreate, 409, armBody("SkuNotAvailable", "restricted", ""), nil, provider.ErrCapacity, "SkuNotAvailable", 0},
		{"ImageNotFound is not NotFound", opCreate, 404, armBody("ImageNotFound", "no such image", ""), nil, provider.ErrInvalidSpec, "ImageNotFound", 0},
		{"InvalidParameter on the image", opCreate, 400, armBody("InvalidParameter", "The Image cannot be found", "imageReference"), nil, provider.ErrInvalidSpec, "InvalidParameter", 0},
		{"InvalidParameter on the size", opCreate, 400, armBody("InvalidParameter", "bad size", "vmSize"), nil, provider.ErrInvalidSpec, "InvalidParameter", 0},
		{"InvalidParameter on the size's full path", opCreate, 400, armBody("InvalidParameter", "missing", "hardwareProfile.vmSize"), nil, provider.ErrInvalidSpec, "InvalidParameter", 0},
		{"InvalidParameter on the OS profile is the node's", opCreate, 400, armBody("InvalidParameter", "The admin user name is not allowed.", "adminUsername"), nil, provider.ErrNodeConfig, "InvalidParameter", 0},
		{"InvalidParameter on the subnet is the node's", opCreate, 400, armBody("InvalidParameter", "Subnet is not valid.", "properties.ipConfigurations[0].properties.subnet"), nil, provider.ErrNodeConfig, "InvalidParameter", 0},
		{"InvalidParameter without a target naming the size", opCreate, 400, armBody("InvalidParameter", "The value zz9 provided for the VM size is not valid.", ""), nil, provider.ErrInvalidSpec, "InvalidParameter", 0},
		{"a reference to a missing subnet is the node's", opCreate, 400, armBody("InvalidResourceReference", "Resource /subscriptions/s/.../subnets/x referenced by resource nic was not found.", ""), nil, provider.ErrNodeConfig, "InvalidResourceReference", 0},
		{"AuthorizationFailed", opList, 403, armBody("AuthorizationFailed", "no", ""), nil, provider.ErrAuth, "AuthorizationFailed", 0},
		{"InvalidAuthenticationToken", opGet, 401, armBody("InvalidAuthenticationToken", "bad token", ""), nil, provider.ErrAuth, "InvalidAuthenticationToken", 0},
		{"401 without a body", opGet, 401, "", nil, provider.ErrAuth, "", 0},
		{"SubscriptionNotFound", opList, 404, armBody("SubscriptionNotFound", "no sub", ""), nil, provider.ErrAuth, "SubscriptionNotFound", 0},
		{"ResourceNotFound on get", opGet, 404, armBody("ResourceNotFound", "gone", ""), nil, provider.ErrNotFound, "ResourceNotFound", 0},
		{"NotFound from the network RP", opDelete, 404, armBody("NotFound", "gone", ""), nil, provider.ErrNotFound, "NotFound", 0},
		{"404 without a body", opGet, 404, "", nil, provider.ErrNotFound, "", 0},
		{"a reference gone during create", opCreate, 404, armBody("ResourceNotFound", "subnet gone", ""), nil, nil, "ResourceNotFound", 0},
		{"ResourceGroupNotFound is no evidence", opGet, 404, armBody("ResourceGroupNotFound", "no group", ""), nil, nil, "ResourceGroupNotFound", 0},
		{"Conflict", opCreate, 409, armBody("Conflict", "busy", ""), nil, provider.ErrConflict, "Conflict", 0},
		{"If-None-Match lost", opCreate, 412, armBody("PreconditionFailed", "exists", ""), nil, provider.ErrConflict, "PreconditionFailed", 0},
		{"NicInUse", opDelete, 400, armBody("NicInUse", "attached", ""), nil, provider.ErrConflict, "NicInUse", 0},
		{"unknown 409", opCreate, 409, armBody("SomethingNew", "?", ""), nil, provider.ErrConflict, "SomethingNew", 0},
		{"InternalServerError", opGet, 500, armBody("InternalServerError", "oops", ""), nil, nil, "InternalServerError", 0},
		{"503 without a body", opGet, 503, "", nil, nil, "", 0},
		{"unknown 400", opCreate, 400, armBody("InvalidRequestContent", "bad json", ""), nil, nil, "InvalidRequestContent", 0},
	}
	kinds := []error{provider.ErrNotFound, provider.ErrThrottled, provider.ErrQuota, provider.ErrCapacity,
		provider.ErrInvalidSpec, provider.ErrAuth, provider.ErrConflict, provider.ErrNodeConfig}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sdkErr := responseError(tc.status, tc.body, tc.header)
			err := classify(tc.op, sdkErr)
			var pe *provider.Error
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tc.kind, pe.Kind)
			for _, k := range kinds {
				assert.Equal(t, k == tc.kind, errors.Is(err, k), "errors.Is %v", k)
			}
			assert.Equal(t, ProviderName, pe.Provider)
			assert.Equal(t, tc.op, pe.Op)
			assert.Equal(t, tc.code, pe.Code)
			assert.Equal(t, tc.status, pe.Status)
			assert.Equal(t, tc.retryAfter, pe.RetryAfter)
			assert.ErrorIs(t, err, sdkErr, "the SDK error underneath")
			var re *azcore.ResponseError
			assert.ErrorAs(t, err, &re)
		})
	}
}

// TestRefusalsNameWhatWasRefused: a refusal of the size or the image says
// so, for the reconciler to tell the pod's choice from the node's default.
func TestRefusalsNameWhatWasRefused(t *testing.T) {
	for body, want := range map[string]string{
		armBody("InvalidParameter", "bad size", "vmSize"):                           provider.RefusedInstanceType,
		armBody("InvalidParameter", "The Image cannot be found", "imageReference"):  provider.RefusedImage,
		armBody("ImageNotFound", "The platform image is not available.", ""):        provider.RefusedImage,
		armBody("InvalidParameter", "The admin user name is not allowed.", "admin"): "",
	} {
		assert.Equal(t, want, provider.RefusedPart(classify(opCreate, responseError(400, body, nil))), body)
	}
}

func TestClassifyKeepsTheMessageAndTarget(t *testing.T) {
	err := classify(opCreate, responseError(400, armBody("InvalidParameter", "The value zz9 provided for the VM size is not valid.", "vmSize"), nil))
	assert.Equal(t, "azure create: invalid VM spec: InvalidParameter: The value zz9 provided for the VM size is not valid. (target vmSize)", err.Error())
}

func TestClassifyNonCloudErrors(t *testing.T) {
	err := classify(opGet, fmt.Errorf("send: %w", context.DeadlineExceeded))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var pe *provider.Error
	assert.False(t, errors.As(err, &pe), "a timeout is not the cloud's answer")

	err = classify(opList, fmt.Errorf("authorize: %w", &credentialError{errors.New("WorkloadIdentityCredential: no token file")}))
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, provider.ErrAuth, pe.Kind)
	assert.Equal(t, "CredentialUnavailable", pe.Code)

	err = classify(opList, &credentialError{context.Canceled})
	assert.NotErrorIs(t, err, provider.ErrAuth, "a cancelled token request is not an auth failure")
}

func TestMissing(t *testing.T) {
	assert.True(t, missing(responseError(404, armBody("ResourceNotFound", "", ""), nil)))
	assert.True(t, missing(responseError(404, armBody("NotFound", "", ""), nil)))
	assert.True(t, missing(responseError(404, "", nil)))
	assert.False(t, missing(responseError(404, armBody("ResourceGroupNotFound", "", ""), nil)), "a missing group is not a missing VM")
	assert.False(t, missing(responseError(404, armBody("ImageNotFound", "", ""), nil)))
	assert.False(t, missing(responseError(500, "", nil)))
	assert.False(t, missing(errors.New("connection refused")))
}
