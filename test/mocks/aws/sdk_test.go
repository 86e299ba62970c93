package ec2fake

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/awsbody"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	sdkKeyID  = "AKIAFAKEEC2TEST00001"
	sdkSecret = "fake-ec2-secret-0123456789"
)

var sdkTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newSDK returns a core and an EC2 client of the official SDK on a fake
// that verifies signatures; the client signs with secret.
func newSDK(t *testing.T, secret string) (*cloud.Cloud, *ec2.Client) {
	t.Helper()
	c := cloud.New(CloudOptions(cloud.Options{PageSize: 50, Now: func() time.Time { return sdkTime }}))
	srv := httptest.NewServer(NewServer(c, WithCredentials(sdkKeyID, sdkSecret)))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{
		Region:           "us-east-1",
		Credentials:      credentials.NewStaticCredentialsProvider(sdkKeyID, secret, ""),
		BaseEndpoint:     aws.String(srv.URL),
		RetryMaxAttempts: 1,
	}, detachBodies)
	return c, client
}

// detachBodies gives every SDK client of these tests the body copy caa's
// own EC2 client makes (internal/awsbody): without it the SDK's early close
// of its request body breaks about one large reply in forty under -race
// (TestDescribePaginates), a fault of the client, not of the fake.
func detachBodies(o *ec2.Options) { o.HTTPClient = awsbody.Detach(o.HTTPClient) }

func apiCode(t *testing.T, err error) string {
	t.Helper()
	var apiErr smithy.APIError
	require.True(t, errors.As(err, &apiErr), "an API error: %v", err)
	return apiErr.ErrorCode()
}

func runInput(token string, tags ...string) *ec2.RunInstancesInput {
	var ts []types.Tag
	for i := 0; i+1 < len(tags); i += 2 {
		ts = append(ts, types.Tag{Key: aws.String(tags[i]), Value: aws.String(tags[i+1])})
	}
	return &ec2.RunInstancesInput{
		ImageId: aws.String(goodImage), InstanceType: goodType, MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		ClientToken: aws.String(token),
		UserData:    aws.String(base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho hi\n"))),
		SubnetId:    aws.String("subnet-0a1b2c3d"), SecurityGroupIds: []string{"sg-0a1b2c3d", "sg-1a2b3c4d"},
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpTokens: types.HttpTokensStateRequired, HttpPutResponseHopLimit: aws.Int32(2),
		},
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: ts},
			{ResourceType: types.ResourceTypeVolume, Tags: ts},
		},
	}
}

func TestSignaturesAreVerified(t *testing.T) {
	ctx := context.Background()
	_, good := newSDK(t, sdkSecret)
	_, err := good.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	require.NoError(t, err)
	_, err = good.RunInstances(ctx, runInput("tok-sig", "Name", "signed"))
	require.NoError(t, err, "a request with a body and tags verifies too")

	_, bad := newSDK(t, "another-secret")
	_, err = bad.DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
	assert.Equal(t, "AuthFailure", apiCode(t, err))
	assert.NotContains(t, err.Error(), sdkKeyID, "the reply does not echo the key")
}

func TestRunAndDescribeRoundTrip(t *testing.T) {
	ctx := context.Background()
	c, client := newSDK(t, sdkSecret)
	c.SetFaults(cloud.Faults{BootDelay: time.Minute})
	out, err := client.RunInstances(ctx, runInput("tok-1", "Name", "vm-one", "team", "blue"))
	require.NoError(t, err)
	require.Len(t, out.Instances, 1)
	launched := out.Instances[0]
	id := aws.ToString(launched.InstanceId)
	assert.Regexp(t, `^i-[0-9a-f]{17}$`, id)
	assert.Equal(t, "r-"+id[2:], aws.ToString(out.ReservationId))
	assert.Equal(t, types.InstanceStateNamePending, launched.State.Name)

	desc, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	require.NoError(t, err)
	require.Len(t, desc.Reservations, 1)
	require.Len(t, desc.Reservations[0].Instances, 1)
	in := desc.Reservations[0].Instances[0]
	assert.Equal(t, id, aws.ToString(in.InstanceId))
	assert.Equal(t, goodImage, aws.ToString(in.ImageId))
	assert.Equal(t, types.InstanceType(goodType), in.InstanceType)
	assert.Equal(t, "tok-1", aws.ToString(in.ClientToken))
	assert.Equal(t, sdkTime, aws.ToTime(in.LaunchTime))
	assert.Equal(t, "us-east-1a", aws.ToString(in.Placement.AvailabilityZone))
	assert.NotEmpty(t, aws.ToString(in.PrivateIpAddress))
	assert.Equal(t, "subnet-0a1b2c3d", aws.ToString(in.SubnetId))
	require.Len(t, in.SecurityGroups, 2)
	assert.Equal(t, "sg-1a2b3c4d", aws.ToString(in.SecurityGroups[1].GroupId))
	assert.Equal(t, types.HttpTokensStateRequired, in.MetadataOptions.HttpTokens)
	assert.Equal(t, int32(2), aws.ToInt32(in.MetadataOptions.HttpPutResponseHopLimit))
	assert.ElementsMatch(t, []types.Tag{{Key: aws.String("Name"), Value: aws.String("vm-one")}, {Key: aws.String("team"), Value: aws.String("blue")}}, in.Tags)

	inst := c.Instances()
	require.Len(t, inst, 1)
	// The core's copies carry no user data, only its length: 18 bytes
	// decoded, where the base64 text was 24.
	assert.Equal(t, len("#!/bin/sh\necho hi\n"), inst[0].UserDataLen, "user data arrives decoded")
	assert.Equal(t, "vm-one", inst[0].Name)

	vols := c.Resources("volume")
	require.Len(t, vols, 1, "one root volume")
	assert.Equal(t, map[string]string{"Name": "vm-one", "team": "blue"}, vols[0].Tags)
	assert.Equal(t, id, vols[0].Owner)
	require.Len(t, in.BlockDeviceMappings, 1)
	assert.Equal(t, vols[0].ID, aws.ToString(in.BlockDeviceMappings[0].Ebs.VolumeId))
	assert.True(t, aws.ToBool(in.BlockDeviceMappings[0].Ebs.DeleteOnTermination))
}

func TestClientTokenMakesRunInstancesIdempotent(t *testing.T) {
	ctx := context.Background()
	c, client := newSDK(t, sdkSecret)
	first, err := client.RunInstances(ctx, runInput("tok-2"))
	require.NoError(t, err)
	again, err := client.RunInstances(ctx, runInput("tok-2"))
	require.NoError(t, err)
	assert.Equal(t, aws.ToString(first.Instances[0].InstanceId), aws.ToString(again.Instances[0].InstanceId))

	other := runInput("tok-2")
	other.InstanceType = "m5.large"
	_, err = client.RunInstances(ctx, other)
	assert.Equal(t, "IdempotentParameterMismatch", apiCode(t, err))

	assert.Len(t, c.Instances(), 1)
	assert.Len(t, c.Resources("volume"), 1, "replays leave no stray volume")
}

func TestDescribeFilters(t *testing.T) {
	ctx := context.Background()
	c, client := newSDK(t, sdkSecret)
	ids := map[string]string{}
	for _, n := range []struct{ token, node string }{{"a", "n1"}, {"b", "n1"}, {"c", "n2"}} {
		out, err := client.RunInstances(ctx, runInput(n.token, "node", n.node, "cluster", "k1"))
		require.NoError(t, err)
		ids[n.token] = aws.ToString(out.Instances[0].InstanceId)
	}
	require.NoError(t, c.Kill(ids["b"]))

	f := func(name string, values ...string) types.Filter {
		return types.Filter{Name: aws.String(name), Values: values}
	}
	tests := []struct {
		name    string
		filters []types.Filter
		want    []string
	}{
		{"tag", []types.Filter{f("tag:node", "n1")}, []string{"a", "b"}},
		{"values are or-ed", []types.Filter{f("tag:node", "n1", "n2")}, []string{"a", "b", "c"}},
		{"filters are and-ed", []types.Filter{f("tag:node", "n1"), f("instance-state-name", "running")}, []string{"a"}},
		{"state", []types.Filter{f("instance-state-name", "terminated")}, []string{"b"}},
		{"client token", []types.Filter{f("client-token", "c")}, []string{"c"}},
		{"tag key", []types.Filter{f("tag-key", "cluster")}, []string{"a", "b", "c"}},
		{"missing tag", []types.Filter{f("tag:team", "blue")}, nil},
		{"instance type", []types.Filter{f("instance-type", "m5.large")}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: tc.filters})
			require.NoError(t, err)
			var got []string
			for _, r := range out.Reservations {
				for _, in := range r.Instances {
					got = append(got, aws.ToString(in.ClientToken))
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestDescribePaginates(t *testing.T) {
	ctx := context.Background()
	_, client := newSDK(t, sdkSecret)
	for i := range 12 {
		_, err := client.RunInstances(ctx, runInput(fmt.Sprintf("p%02d", i), "pool", "x"))
		require.NoError(t, err)
	}
	in := &ec2.DescribeInstancesInput{
		Filters:    []types.Filter{{Name: aws.String("tag:pool"), Values: []string{"x"}}},
		MaxResults: aws.Int32(5),
	}
	var sizes []int
	var tokens []string
	pages := ec2.NewDescribeInstancesPaginator(client, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		require.NoError(t, err)
		sizes = append(sizes, len(page.Reservations))
		if page.NextToken != nil {
			tokens = append(tokens, *page.NextToken)
		}
	}
	assert.Equal(t, []int{5, 5, 2}, sizes)
	require.Len(t, tokens, 2)

	_, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{NextToken: aws.String(tokens[0]), MaxResults: aws.Int32(5)})
	assert.Equal(t, "InvalidPaginationToken", apiCode(t, err), "a token only goes with its own filters")
}

func TestUnknownInstancesAreNotFound(t *testing.T) {
	ctx := context.Background()
	c, client := newSDK(t, sdkSecret)
	out, err := client.RunInstances(ctx, runInput("tok-3"))
	require.NoError(t, err)
	live := aws.ToString(out.Instances[0].InstanceId)

	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{"i-00000000000000bad"}})
	assert.Equal(t, "InvalidInstanceID.NotFound", apiCode(t, err))

	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{live, "i-00000000000000bad"}})
	assert.Equal(t, "InvalidInstanceID.NotFound", apiCode(t, err))
	assert.Len(t, c.Live(), 1, "one unknown id fails the whole request")
}

func TestTerminateKeepsTheInstanceVisibleAndDeletesItsVolume(t *testing.T) {
	ctx := context.Background()
	c, client := newSDK(t, sdkSecret)
	out, err := client.RunInstances(ctx, runInput("tok-4"))
	require.NoError(t, err)
	id := aws.ToString(out.Instances[0].InstanceId)

	for range 2 {
		term, err := client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
		require.NoError(t, err, "terminating twice is fine")
		require.Len(t, term.TerminatingInstances, 1)
		assert.Equal(t, types.InstanceStateNameTerminated, term.TerminatingInstances[0].CurrentState.Name)
	}
	assert.Empty(t, c.Resources(""), "the root volume went with the instance")

	desc, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	require.NoError(t, err, "terminated instances stay visible for a while")
	in := desc.Reservations[0].Instances[0]
	assert.Equal(t, types.InstanceStateNameTerminated, in.State.Name)
	assert.Equal(t, "Client.UserInitiatedShutdown", aws.ToString(in.StateReason.Code))
	assert.Empty(t, in.BlockDeviceMappings)
}
