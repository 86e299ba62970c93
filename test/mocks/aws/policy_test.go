package ec2fake

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "arn:aws:ec2:us-east-1:1:instance/i-1", true},
		{"ec2:*", "ec2:RunInstances", true},
		{"ec2:Run*", "ec2:RunInstances", true},
		{"ec2:Run*", "ec2:TerminateInstances", false},
		{"arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:us-east-1:123:instance/i-0abc", true},
		{"arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:us-east-1:123:volume/vol-1", false},
		{"arn:aws:ec2:*::image/*", "arn:aws:ec2:us-east-1::image/ami-1", true},
		{"?*", "", false},
		{"?*", "x", true},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"*b*b", "abcbxb", true},
		{"exact", "exact", true},
		{"exact", "exacT", false},
	} {
		assert.Equal(t, tc.want, glob(tc.pattern, tc.s), "glob(%q, %q)", tc.pattern, tc.s)
	}
}

func TestPolicyEvaluation(t *testing.T) {
	p, err := ParsePolicy([]byte(`{
	  "Version": "2012-10-17",
	  "Statement": [
	    {"Sid": "Read", "Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"},
	    {"Sid": "Tagged", "Effect": "Allow", "Action": ["ec2:TerminateInstances"], "Resource": "arn:aws:ec2:*:*:instance/*",
	     "Condition": {"StringEquals": {"aws:ResourceTag/owner": ["caa", "also-caa"]}, "Null": {"aws:ResourceTag/cluster": "false"}}},
	    {"Sid": "Like", "Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*",
	     "Condition": {"StringLike": {"aws:RequestTag/name": "caa-*"}, "StringNotEquals": {"aws:RequestTag/env": "prod"}}},
	    {"Sid": "NoProd", "Effect": "Deny", "Action": "ec2:*", "Resource": "*", "Condition": {"StringEquals": {"aws:ResourceTag/env": "prod"}}}
	  ]}`))
	require.NoError(t, err)
	inst := "arn:aws:ec2:us-east-1:123456789012:instance/i-1"
	for _, tc := range []struct {
		name string
		req  Request
		want Decision
	}{
		{"allowed read, action case-insensitive", Request{Action: "EC2:describeinstances", Resource: "*"}, Decision{Allowed: true, Statement: "Read"}},
		{"implicit deny of an action no statement names", Request{Action: "ec2:StopInstances", Resource: inst}, Decision{}},
		{"tags that match", Request{Action: "ec2:TerminateInstances", Resource: inst,
			Context: map[string][]string{"aws:ResourceTag/owner": {"also-caa"}, "aws:ResourceTag/cluster": {"c"}}}, Decision{Allowed: true, Statement: "Tagged"}},
		{"a tag value that does not", Request{Action: "ec2:TerminateInstances", Resource: inst,
			Context: map[string][]string{"aws:ResourceTag/owner": {"other"}, "aws:ResourceTag/cluster": {"c"}}}, Decision{}},
		{"a tag key's case matters", Request{Action: "ec2:TerminateInstances", Resource: inst,
			Context: map[string][]string{"aws:ResourceTag/Owner": {"caa"}, "aws:ResourceTag/cluster": {"c"}}}, Decision{}},
		{"the prefix's case does not", Request{Action: "ec2:TerminateInstances", Resource: inst,
			Context: map[string][]string{"AWS:resourcetag/owner": {"caa"}, "aws:ResourceTag/cluster": {"c"}}}, Decision{Allowed: true, Statement: "Tagged"}},
		{"Null: a required tag missing", Request{Action: "ec2:TerminateInstances", Resource: inst,
			Context: map[string][]string{"aws:ResourceTag/owner": {"caa"}}}, Decision{}},
		{"another resource type", Request{Action: "ec2:TerminateInstances", Resource: "arn:aws:ec2:us-east-1:1:volume/v",
			Context: map[string][]string{"aws:ResourceTag/owner": {"caa"}, "aws:ResourceTag/cluster": {"c"}}}, Decision{}},
		{"StringLike and a missing negated key", Request{Action: "ec2:RunInstances", Resource: inst,
			Context: map[string][]string{"aws:RequestTag/name": {"caa-x"}}}, Decision{Allowed: true, Statement: "Like"}},
		{"StringNotEquals refuses", Request{Action: "ec2:RunInstances", Resource: inst,
			Context: map[string][]string{"aws:RequestTag/name": {"caa-x"}, "aws:RequestTag/env": {"prod"}}}, Decision{}},
		{"an explicit deny wins over an allow", Request{Action: "ec2:DescribeInstances", Resource: "*",
			Context: map[string][]string{"aws:ResourceTag/env": {"prod"}}}, Decision{ExplicitDeny: true, Statement: "NoProd"}},
	} {
		assert.Equal(t, tc.want, p.Evaluate(tc.req), tc.name)
	}

	without := p.Without("ec2:TerminateInstances")
	assert.Len(t, without.Statement, 3, "the statement left with no action is gone")
	assert.Equal(t, []string{"ec2:Describe*", "ec2:RunInstances"}, without.Actions(), "Deny statements keep theirs and are not listed")
	assert.Len(t, p.Statement, 4, "Without leaves the original alone")
}

func TestParsePolicyRefusesWhatItCannotEvaluate(t *testing.T) {
	for name, doc := range map[string]string{
		"old version":      `{"Version":"2008-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}`,
		"NotAction":        `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","NotAction":"ec2:*","Resource":"*"}]}`,
		"unknown operator": `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"ArnLike":{"aws:SourceArn":"x"}}}]}`,
		"set operator":     `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"ForAllValues:StringEquals":{"aws:TagKeys":"x"}}}]}`,
		"bad effect":       `{"Version":"2012-10-17","Statement":[{"Effect":"Maybe","Action":"*","Resource":"*"}]}`,
		"no resource":      `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*"}]}`,
		"bad Null":         `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"Null":{"k":"maybe"}}}]}`,
	} {
		_, err := ParsePolicy([]byte(doc))
		assert.Error(t, err, name)
	}
}

// TestPolicyOverTheWire: with a policy the EC2 fake answers a call it
// does not allow 403 UnauthorizedOperation naming the action and resource
// with an encoded message, DryRun is DryRunOperation when allowed, and a
// terminate is decided on the instance's own tags.
func TestPolicyOverTheWire(t *testing.T) {
	ctx := context.Background()
	p, err := ParsePolicy([]byte(`{"Version": "2012-10-17", "Statement": [
	  {"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
	  {"Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateTags"], "Resource": "*"},
	  {"Effect": "Allow", "Action": "ec2:TerminateInstances", "Resource": "*", "Condition": {"StringEquals": {"aws:ResourceTag/owner": "me"}}}
	]}`))
	require.NoError(t, err)
	c := cloud.New(CloudOptions(cloud.Options{}))
	srv := httptest.NewServer(NewServer(c, WithCredentials(sdkKeyID, sdkSecret), WithPolicy(p)))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider(sdkKeyID, sdkSecret, "")}, detachBodies)

	in := runInput("tok-dry", "owner", "me")
	in.DryRun = aws.Bool(true)
	_, err = client.RunInstances(ctx, in)
	assert.Equal(t, "DryRunOperation", apiCode(t, err))
	assert.Empty(t, c.Instances(), "a dry run makes nothing")

	mine, err := client.RunInstances(ctx, runInput("tok-mine", "owner", "me"))
	require.NoError(t, err)
	theirs, err := client.RunInstances(ctx, runInput("tok-theirs", "owner", "you"))
	require.NoError(t, err)
	mineID, theirsID := aws.ToString(mine.Instances[0].InstanceId), aws.ToString(theirs.Instances[0].InstanceId)

	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{theirsID}, DryRun: aws.Bool(true)})
	require.Equal(t, "UnauthorizedOperation", apiCode(t, err))
	msg := err.Error()
	assert.Contains(t, msg, "is not authorized to perform: ec2:TerminateInstances on resource: arn:aws:ec2:us-east-1:123456789012:instance/"+theirsID)
	assert.Contains(t, msg, "User: arn:aws:iam::123456789012:user/caa")
	encoded := msg[strings.LastIndex(msg, "Encoded authorization failure message: ")+len("Encoded authorization failure message: "):]
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(encoded))
	require.NoError(t, err)
	var decoded map[string]any
	require.NoError(t, json.Unmarshal(raw, &decoded))
	assert.Equal(t, false, decoded["allowed"])

	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{theirsID}})
	assert.Equal(t, "UnauthorizedOperation", apiCode(t, err))
	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{mineID}, DryRun: aws.Bool(true)})
	assert.Equal(t, "DryRunOperation", apiCode(t, err))
	assert.Len(t, c.Live(), 2, "nothing terminated yet")
	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{mineID}})
	require.NoError(t, err)
	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{"i-0123456789abcdef0"}, DryRun: aws.Bool(true)})
	assert.Equal(t, "InvalidInstanceID.NotFound", apiCode(t, err), "an unknown instance has no tags to authorize against")

	_, err = client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{DryRun: aws.Bool(true)})
	assert.Equal(t, "DryRunOperation", apiCode(t, err))

	// An explicit deny, and a call no statement allows.
	deny, err := ParsePolicy([]byte(`{"Version": "2012-10-17", "Statement": [
	  {"Effect": "Allow", "Action": "ec2:*", "Resource": "*"},
	  {"Effect": "Deny", "Action": "ec2:RunInstances", "Resource": "arn:aws:ec2:*::image/*"}]}`))
	require.NoError(t, err)
	srv2 := httptest.NewServer(NewServer(c, WithCredentials(sdkKeyID, sdkSecret), WithPolicy(deny)))
	t.Cleanup(srv2.Close)
	client2 := ec2.New(ec2.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv2.URL), RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider(sdkKeyID, sdkSecret, "")}, detachBodies)
	_, err = client2.RunInstances(ctx, runInput("tok-denied"))
	assert.Equal(t, "UnauthorizedOperation", apiCode(t, err))
	assert.Contains(t, err.Error(), "with an explicit deny")
	assert.Contains(t, err.Error(), "on resource: arn:aws:ec2:us-east-1::image/"+goodImage)
}

// TestDryRunsAreNoWrites: a dry run counts under OpDryRun, never as a
// create or delete, and takes no resource token of the published limits.
func TestDryRunsAreNoWrites(t *testing.T) {
	ctx := context.Background()
	c := cloud.New(CloudOptions(cloud.Options{}))
	budget := NewBudget(nil)
	srv := httptest.NewServer(NewServer(c, WithCredentials(sdkKeyID, sdkSecret), WithBudget(budget)))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider(sdkKeyID, sdkSecret, "")}, detachBodies)
	in := runInput("tok-dry")
	in.DryRun = aws.Bool(true)
	_, err := client.RunInstances(ctx, in)
	assert.Equal(t, "DryRunOperation", apiCode(t, err))
	counters := c.Counters()
	assert.Equal(t, int64(1), counters[OpDryRun])
	assert.Zero(t, counters[cloud.OpCreate])
	tokens, ok := budget.Tokens(ClassRunInstances, "")
	require.True(t, ok)
	assert.Equal(t, budget.Limits()[ClassRunInstances].Burst, tokens, "no instance token taken")
}
