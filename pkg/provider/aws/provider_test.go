package aws

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

// stubEC2 stands in for the EC2 client: it records every input and answers
// with the functions a test sets.
type stubEC2 struct {
	mu         sync.Mutex
	runs       []*ec2.RunInstancesInput
	describes  []*ec2.DescribeInstancesInput
	terminates []*ec2.TerminateInstancesInput

	run       func(*ec2.RunInstancesInput) (*ec2.RunInstancesOutput, error)
	describe  func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error)
	terminate func(*ec2.TerminateInstancesInput) (*ec2.TerminateInstancesOutput, error)
}

func (s *stubEC2) RunInstances(_ context.Context, in *ec2.RunInstancesInput, _ ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error) {
	s.mu.Lock()
	s.runs = append(s.runs, in)
	s.mu.Unlock()
	return s.run(in)
}

func (s *stubEC2) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	s.mu.Lock()
	s.describes = append(s.describes, in)
	s.mu.Unlock()
	return s.describe(in)
}

func (s *stubEC2) TerminateInstances(_ context.Context, in *ec2.TerminateInstancesInput, _ ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error) {
	s.mu.Lock()
	s.terminates = append(s.terminates, in)
	s.mu.Unlock()
	return s.terminate(in)
}

func stubProvider(s *stubEC2) *Provider {
	return &Provider{api: s, cfg: Config{
		Region: testRegion, SubnetID: testSubnet, SecurityGroupIDs: []string{testGroup},
		Image: "ami-00000000000000def", InstanceType: "t3.small",
		ExtraTags: map[string]string{"cost-center": "from-config", "team": "platform"},
	}}
}

// sdkError builds the error chain the SDK returns for an EC2 error reply.
func sdkError(code string, status int, header http.Header) error {
	return &smithy.OperationError{ServiceID: "EC2", OperationName: "Op", Err: &awshttp.ResponseError{
		RequestID: "req-1",
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status, Header: header}},
			Err:      &smithy.GenericAPIError{Code: code, Message: "message for " + code},
		},
	}}
}

func instance(id, state string) types.Instance {
	return types.Instance{
		InstanceId: awssdk.String(id), State: &types.InstanceState{Name: types.InstanceStateName(state)},
		Tags: []types.Tag{{Key: awssdk.String(provider.TagKey), Value: awssdk.String("k")}},
	}
}

func page(token string, ids ...string) *ec2.DescribeInstancesOutput {
	out := &ec2.DescribeInstancesOutput{}
	if token != "" {
		out.NextToken = awssdk.String(token)
	}
	for _, id := range ids {
		out.Reservations = append(out.Reservations, types.Reservation{Instances: []types.Instance{instance(id, "running")}})
	}
	return out
}

func testSpec() provider.Spec {
	return provider.Spec{
		Key: "0c7a-uid-a1", Cluster: "c1", Node: "n1", PodUID: "0c7a-uid", PodNamespace: "ns", PodName: "web",
		UserData: []byte("TOKEN=s3cr3t"), ExtraTags: map[string]string{"cost-center": "from-spec"},
	}
}

func filterMap(fs []types.Filter) map[string][]string {
	m := map[string][]string{}
	for _, f := range fs {
		m[awssdk.ToString(f.Name)] = f.Values
	}
	return m
}

func TestCreateLaunchesWithTheRightRequest(t *testing.T) {
	s := &stubEC2{
		describe: func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) { return page(""), nil },
		run: func(in *ec2.RunInstancesInput) (*ec2.RunInstancesOutput, error) {
			// EC2 answers with the instance as launched, its tags included.
			out := instance("i-0123456789abcdef0", "pending")
			out.Tags = in.TagSpecifications[0].Tags
			return &ec2.RunInstancesOutput{Instances: []types.Instance{out}}, nil
		},
	}
	spec := testSpec()
	vm, err := stubProvider(s).Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Equal(t, "i-0123456789abcdef0", vm.ID)
	assert.Equal(t, provider.StatePending, vm.State)
	assert.Empty(t, s.describes, "a fresh key is not looked up")

	require.Len(t, s.runs, 1)
	in := s.runs[0]
	assert.Equal(t, clientToken(spec.Key), awssdk.ToString(in.ClientToken))
	assert.Equal(t, "ami-00000000000000def", awssdk.ToString(in.ImageId), "the default image fills an empty spec")
	assert.Equal(t, types.InstanceType("t3.small"), in.InstanceType)
	assert.Equal(t, int32(1), awssdk.ToInt32(in.MinCount))
	assert.Equal(t, int32(1), awssdk.ToInt32(in.MaxCount))
	assert.Equal(t, testSubnet, awssdk.ToString(in.SubnetId))
	assert.Equal(t, []string{testGroup}, in.SecurityGroupIds)
	assert.Equal(t, types.HttpTokensStateRequired, in.MetadataOptions.HttpTokens, "IMDSv2 only")
	assert.Equal(t, int32(2), awssdk.ToInt32(in.MetadataOptions.HttpPutResponseHopLimit))
	decoded, err := base64.StdEncoding.DecodeString(awssdk.ToString(in.UserData))
	require.NoError(t, err)
	assert.Equal(t, spec.UserData, decoded)

	require.Len(t, in.TagSpecifications, 2)
	want := instanceTags(stubProvider(s).cfg.ExtraTags, spec)
	for i, rt := range []types.ResourceType{types.ResourceTypeInstance, types.ResourceTypeVolume} {
		assert.Equal(t, rt, in.TagSpecifications[i].ResourceType)
		assert.Equal(t, ec2Tags(want), in.TagSpecifications[i].Tags)
	}
	assert.Equal(t, "from-spec", want["cost-center"], "the spec's extra tags win over the configuration's")
	assert.Equal(t, "platform", want["team"])
	assert.Equal(t, "caa-ns-web", want["Name"])

	// A key that may have been sent is looked up first, by its token and
	// its key tag; none found, it is launched.
	spec.MaybeSent = true
	_, err = stubProvider(s).Create(context.Background(), spec)
	require.NoError(t, err)
	require.Len(t, s.describes, 1, "a lookup first")
	assert.Equal(t, map[string][]string{"client-token": {clientToken(spec.Key)}, "tag:caa-key": {spec.Key}}, filterMap(s.describes[0].Filters))
	assert.Len(t, s.runs, 2)
}

func TestCreateFindsAnEarlierLaunchAndMakesNoOther(t *testing.T) {
	spec := testSpec()
	spec.InstanceType, spec.Image = "t3.large", "ami-0123456789abcdef0"
	spec.MaybeSent = true // a create resumed after a crash
	s := &stubEC2{
		describe: func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) {
			out := page("", "i-0aaaaaaaaaaaaaaaa")
			// The earlier launch carries the spec's identity tags (an
			// instance with the token and other tags is refused:
			// TestCreateRefusesAnInstanceForgedWithTheClientToken).
			out.Reservations[0].Instances[0].Tags = ec2Tags(instanceTags(nil, spec))
			return out, nil
		},
	}
	vm, err := stubProvider(s).Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Equal(t, "i-0aaaaaaaaaaaaaaaa", vm.ID)
	assert.Empty(t, s.runs, "no RunInstances when the lookup finds the VM")
}

func TestCreateRejectsAnIncompleteSpecWithoutCalling(t *testing.T) {
	s := &stubEC2{}
	p := stubProvider(s)
	p.cfg.Image = ""
	_, err := p.Create(context.Background(), testSpec())
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Empty(t, s.describes)
}

func TestCreateSurfacesErrorsOfTheLookupAndTheLaunch(t *testing.T) {
	throttled := sdkError("RequestLimitExceeded", 503, http.Header{"Retry-After": {"3"}})
	s := &stubEC2{describe: func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) { return nil, throttled }}
	resumed := testSpec()
	resumed.MaybeSent = true // only such a key is looked up
	_, err := stubProvider(s).Create(context.Background(), resumed)
	assert.ErrorIs(t, err, provider.ErrThrottled)
	d, _ := provider.RetryAfter(err)
	assert.Equal(t, 3*time.Second, d)
	assert.Empty(t, s.runs, "no launch after a failed lookup")

	s = &stubEC2{
		describe: func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) { return page(""), nil },
		run: func(*ec2.RunInstancesInput) (*ec2.RunInstancesOutput, error) {
			return nil, sdkError("InsufficientInstanceCapacity", 500, nil)
		},
	}
	_, err = stubProvider(s).Create(context.Background(), testSpec())
	assert.ErrorIs(t, err, provider.ErrCapacity)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, opCreate, pe.Op)
}

func TestListFollowsNextTokenWithTheSelectorFilters(t *testing.T) {
	pages := map[string]*ec2.DescribeInstancesOutput{
		"":   page("t1", "i-00000000000000001", "i-00000000000000002"),
		"t1": page("t2"), // EC2 may answer an empty page with more to come
		"t2": page("", "i-00000000000000003"),
	}
	s := &stubEC2{describe: func(in *ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) {
		return pages[awssdk.ToString(in.NextToken)], nil
	}}
	vms, err := stubProvider(s).List(context.Background(), provider.Selector{Cluster: "c1", Node: "n1"})
	require.NoError(t, err)
	var ids []string
	for _, vm := range vms {
		ids = append(ids, vm.ID)
	}
	assert.Equal(t, []string{"i-00000000000000001", "i-00000000000000002", "i-00000000000000003"}, ids)
	require.Len(t, s.describes, 3)
	for _, in := range s.describes {
		assert.Equal(t, map[string][]string{"tag:caa-cluster": {"c1"}, "tag:caa-node": {"n1"}, "tag:caa-managed-by": {"caa"}}, filterMap(in.Filters))
		assert.Equal(t, int32(pageSize), awssdk.ToInt32(in.MaxResults))
	}
}

func TestListNeedsAClusterAndANode(t *testing.T) {
	s := &stubEC2{}
	for _, sel := range []provider.Selector{{Cluster: "c1"}, {Node: "n1"}} {
		_, err := stubProvider(s).List(context.Background(), sel)
		assert.Error(t, err, "%+v", sel)
	}
	assert.Empty(t, s.describes)
}

func TestGet(t *testing.T) {
	var answer *ec2.DescribeInstancesOutput
	var fail error
	s := &stubEC2{describe: func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) { return answer, fail }}
	p := stubProvider(s)

	answer = page("", "i-0123456789abcdef0")
	vm, err := p.Get(context.Background(), "i-0123456789abcdef0")
	require.NoError(t, err)
	assert.Equal(t, "i-0123456789abcdef0", vm.ID)
	assert.Equal(t, []string{"i-0123456789abcdef0"}, s.describes[0].InstanceIds)
	assert.Nil(t, s.describes[0].MaxResults, "EC2 refuses MaxResults with instance ids")

	answer = page("")
	_, err = p.Get(context.Background(), "i-0123456789abcdef0")
	assert.ErrorIs(t, err, provider.ErrNotFound, "an answer without the instance")

	answer, fail = nil, sdkError("InvalidInstanceID.NotFound", 400, nil)
	_, err = p.Get(context.Background(), "i-0123456789abcdef0")
	assert.ErrorIs(t, err, provider.ErrNotFound)
	assert.Len(t, s.describes, 3, "one call per Get: NotFound is not retried")
}

func TestDelete(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error // nil: Delete returns nil
	}{
		{"accepted", nil, nil},
		{"already gone", sdkError("InvalidInstanceID.NotFound", 400, nil), nil},
		{"never existed", sdkError("InvalidInstanceID.Malformed", 400, nil), nil},
		{"not allowed", sdkError("UnauthorizedOperation", 403, nil), provider.ErrAuth},
		{"throttled", sdkError("RequestLimitExceeded", 503, nil), provider.ErrThrottled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &stubEC2{terminate: func(*ec2.TerminateInstancesInput) (*ec2.TerminateInstancesOutput, error) {
				return &ec2.TerminateInstancesOutput{}, tc.err
			}}
			err := stubProvider(s).Delete(context.Background(), "i-0123456789abcdef0")
			if tc.want == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.want)
			}
			require.Len(t, s.terminates, 1)
			assert.Equal(t, []string{"i-0123456789abcdef0"}, s.terminates[0].InstanceIds)
		})
	}
}

func TestCreateWithAnOddAnswerIsAnError(t *testing.T) {
	s := &stubEC2{
		describe: func(*ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) { return page(""), nil },
		run:      func(*ec2.RunInstancesInput) (*ec2.RunInstancesOutput, error) { return &ec2.RunInstancesOutput{}, nil },
	}
	_, err := stubProvider(s).Create(context.Background(), testSpec())
	require.Error(t, err)
	assert.NotContains(t, fmt.Sprintf("%v %+v", err, err), "s3cr3t")
}
