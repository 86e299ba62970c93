package ec2fake

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// A client that sizes the root volume from the AMI, as upstream peer-pods'
// AWS provider does at startup and at each launch, gets its answers from
// the official SDK's deserializers, and its launch reads back the address
// per network interface.
func TestCatalogReadsAndARootVolumeSizedLaunch(t *testing.T) {
	ctx := context.Background()
	c, client := newSDK(t, sdkSecret)

	im, err := client.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{goodImage}})
	require.NoError(t, err)
	require.Len(t, im.Images, 1)
	assert.Equal(t, rootDevice, aws.ToString(im.Images[0].RootDeviceName))
	require.Len(t, im.Images[0].BlockDeviceMappings, 1)
	assert.Equal(t, int32(imageRootSize), aws.ToInt32(im.Images[0].BlockDeviceMappings[0].Ebs.VolumeSize))

	it, err := client.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"m6a.large"}})
	require.NoError(t, err)
	require.Len(t, it.InstanceTypes, 1)
	assert.Equal(t, int32(2), aws.ToInt32(it.InstanceTypes[0].VCpuInfo.DefaultVCpus))
	assert.Equal(t, int64(8192), aws.ToInt64(it.InstanceTypes[0].MemoryInfo.SizeInMiB))

	_, err = client.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"m6a.huge"}})
	assert.Equal(t, "InvalidInstanceType", apiCode(t, err))
	_, err = client.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{"ami-zz"}})
	assert.Equal(t, "InvalidAMIID.Malformed", apiCode(t, err))

	in := runInput("tok-root")
	in.BlockDeviceMappings = []types.BlockDeviceMapping{{DeviceName: aws.String(rootDevice), Ebs: &types.EbsBlockDevice{VolumeSize: aws.Int32(30)}}}
	out, err := client.RunInstances(ctx, in)
	require.NoError(t, err)
	got := out.Instances[0]
	require.Len(t, got.NetworkInterfaces, 1, "the primary interface is listed")
	assert.Equal(t, aws.ToString(got.PrivateIpAddress), aws.ToString(got.NetworkInterfaces[0].PrivateIpAddress))
	assert.NotEmpty(t, aws.ToString(got.NetworkInterfaces[0].PrivateIpAddress))
	var sizes []string
	for _, r := range c.Resources("volume") {
		sizes = append(sizes, r.Props["sizeGiB"])
	}
	assert.Equal(t, []string{"30"}, sizes, "the root volume has the size asked for")
	assert.Equal(t, int64(4), c.Counters()[OpCatalog], "the catalog reads count apart from the instance reads")

	small := runInput("tok-small")
	small.BlockDeviceMappings = []types.BlockDeviceMapping{{DeviceName: aws.String(rootDevice), Ebs: &types.EbsBlockDevice{VolumeSize: aws.Int32(4)}}}
	_, err = client.RunInstances(ctx, small)
	assert.Equal(t, "InvalidBlockDeviceMapping", apiCode(t, err), "a root smaller than the AMI's snapshot is refused")
	other := runInput("tok-other")
	other.BlockDeviceMappings = []types.BlockDeviceMapping{{DeviceName: aws.String("/dev/sdf"), Ebs: &types.EbsBlockDevice{VolumeSize: aws.Int32(10)}}}
	_, err = client.RunInstances(ctx, other)
	assert.Equal(t, "InvalidParameterValue", apiCode(t, err))
}

// Restricted to its images and types, the core's catalog shows only those.
func TestCatalogFollowsTheCoresOffer(t *testing.T) {
	ctx := context.Background()
	c := cloud.New(CloudOptions(cloud.Options{Images: []string{goodImage}, Types: []string{"t3.small"}}))
	srv := httptest.NewServer(NewServer(c))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider(sdkKeyID, sdkSecret, ""),
		BaseEndpoint: aws.String(srv.URL), RetryMaxAttempts: 1}, detachBodies)
	_, err := client.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{"ami-0123456789abcdef0"}})
	assert.Equal(t, "InvalidAMIID.NotFound", apiCode(t, err))
	_, err = client.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"m6a.large"}})
	assert.Equal(t, "InvalidInstanceType", apiCode(t, err), "a type the account is not offered")
	_, err = client.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"t3.small"}})
	assert.NoError(t, err)
}
