package ec2fake

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	rootDevice    = "/dev/xvda"
	maxUserData   = 16 << 10 // EC2's limit, before base64
	maxTags       = 50
	maxTagKey     = 128
	maxTagValue   = 256
	maxTokenBytes = 64
)

// launch is what RunInstances was asked for beyond what the core keeps,
// shown again by DescribeInstances.
type launch struct {
	subnetID     string
	groups       []string
	httpTokens   string
	httpEndpoint string
	hopLimit     int
	volumeID     string
}

var runParams = []string{
	"ImageId", "InstanceType", "MinCount", "MaxCount", "ClientToken", "UserData", "SubnetId",
	"SecurityGroupId.#",
	"TagSpecification.#.ResourceType", "TagSpecification.#.Tag.#.Key", "TagSpecification.#.Tag.#.Value",
	"MetadataOptions.HttpTokens", "MetadataOptions.HttpEndpoint", "MetadataOptions.HttpPutResponseHopLimit",
	"DryRun", "CpuOptions.AmdSevSnp",
	"BlockDeviceMapping.#.DeviceName", "BlockDeviceMapping.#.Ebs.VolumeSize",
}

// runInstances launches one instance with its root volume. A replayed
// ClientToken returns the instance the first call made.
//
// With a policy (WithPolicy) the launch is authorized first, resource by
// resource (authz.go); with DryRun an allowed launch of a known image and
// type is answered DryRunOperation and makes nothing.
func (s *server) runInstances(q query, c caller) (any, *apiError) {
	if e := q.check(runParams...); e != nil {
		return nil, e
	}
	dry, e := dryRun(q)
	if e != nil {
		return nil, e
	}
	req, l, tags, e := parseRun(q)
	if e != nil {
		return nil, e
	}
	rootSize, e := parseBlockDevices(q)
	if e != nil {
		return nil, e
	}
	if rootSize == 0 {
		rootSize = imageRootSize
	}
	if e := s.knownNetwork(l); e != nil {
		return nil, e
	}
	req.Unreachable = s.reach(l)
	if e := s.authorize(c, runChecks(c, q, tags)); e != nil {
		return nil, e
	}
	if e := s.checkBootMode(req); e != nil {
		return nil, e
	}
	if dry {
		if err := s.cloud.CheckSpec(req.Image, req.InstanceType); err != nil {
			return nil, s.launchError(err, req)
		}
		return nil, dryRunOK
	}
	volumeTags := tags["volume"]
	vol := s.cloud.PutResource(cloud.Resource{
		ID: fmt.Sprintf("vol-%017x", s.seq.Add(1)), Kind: "volume", Tags: volumeTags,
		Props: map[string]string{"device": rootDevice, "deleteOnTermination": "true", "sizeGiB": strconv.Itoa(rootSize)},
	})
	req.Resources, req.DeleteWith = []string{vol.ID}, []string{vol.ID}
	l.volumeID = vol.ID
	in, err := s.cloud.Create(req)
	if err != nil || !slices.Contains(in.Resources, vol.ID) {
		// A failed launch, or a replayed token whose instance already has
		// its volume: this one was never attached.
		_ = s.cloud.DeleteResource(vol.ID)
	}
	if err != nil {
		return nil, s.launchError(err, req)
	}
	if in.State == provider.StateTerminated {
		// EC2 keeps a client token for longer than it lists the terminated
		// instance that used it, and answers a launch that reuses it with
		// IdempotentInstanceTerminated (400) rather than that instance or
		// a new one. Source: the EC2 API reference, "Error codes for the
		// Amazon EC2 API" (client errors), and its idempotency guide.
		return nil, &apiError{http.StatusBadRequest, "IdempotentInstanceTerminated",
			"The client token you have provided is associated with an instance that has been terminated."}
	}
	l = s.remember(in.ID, l)
	resp := runInstancesResponse{
		RequestID: s.requestID(), ReservationID: reservationID(in.ID), OwnerID: ownerID,
		Instances: []instanceXML{renderInstance(in, l)},
	}
	resp.Groups = resp.Instances[0].Groups
	return resp, nil
}

// typePattern is the shape of an EC2 instance type name: family, a dot, a
// size (t3.micro, m7i-flex.large, u-6tb1.metal).
var typePattern = regexp.MustCompile(`^[a-z][a-z0-9-]*\.[a-z0-9]+$`)

// launchError is EC2's answer to a launch the core refused. An instance
// type that has the shape of a real one but is not among the core's types
// is one EC2 does not offer in the subnet's zone: EC2 answers Unsupported
// (400), naming the type and the zone, to a launch and to its dry run
// alike; only a name that is no instance type at all is
// InvalidParameterValue. Source: the EC2 API's error codes reference
// (Unsupported) and the field reports of that message, e.g.
// github.com/skyplane-project/skyplane/issues/172 and
// github.com/trailofbits/algo/issues/314.
func (s *server) launchError(err error, req cloud.CreateRequest) *apiError {
	switch {
	case errors.Is(err, cloud.ErrBadImage):
		return coreError(err, req.Image)
	case errors.Is(err, cloud.ErrBadType) && typePattern.MatchString(req.InstanceType):
		return &apiError{http.StatusBadRequest, "Unsupported", fmt.Sprintf(
			"Your requested instance type (%s) is not supported in your requested Availability Zone (%s). "+
				"Retry without naming an Availability Zone, or in another one.", req.InstanceType, s.zone)}
	}
	return coreError(err, req.InstanceType)
}

// knownNetwork refuses a subnet or security group the server does not
// know (WithNetwork).
func (s *server) knownNetwork(l *launch) *apiError {
	if s.subnets != nil && l.subnetID != "" && !slices.Contains(s.subnets, l.subnetID) {
		return &apiError{http.StatusBadRequest, "InvalidSubnetID.NotFound", fmt.Sprintf("The subnet ID '%s' does not exist", l.subnetID)}
	}
	for _, g := range l.groups {
		if s.groups != nil && g != s.defaultGroup && !slices.Contains(s.groups, g) {
			return &apiError{http.StatusBadRequest, "InvalidGroup.NotFound", fmt.Sprintf("The security group '%s' does not exist", g)}
		}
	}
	return nil
}

// remember keeps the launch details of an instance's first RunInstances and
// returns those kept.
func (s *server) remember(id string, l *launch) *launch {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.launches[id]; ok {
		return old
	}
	s.launches[id] = l
	return l
}

func (s *server) launchOf(id string) *launch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launches[id]
}

// parseRun reads a launch; the tags come by resource type.
func parseRun(q query) (cloud.CreateRequest, *launch, map[string]map[string]string, *apiError) {
	var req cloud.CreateRequest
	fail := func(e *apiError) (cloud.CreateRequest, *launch, map[string]map[string]string, *apiError) {
		return cloud.CreateRequest{}, nil, nil, e
	}
	if req.Image = q.get("ImageId"); req.Image == "" {
		return fail(missing("ImageId"))
	}
	if !imagePattern.MatchString(req.Image) {
		return fail(&apiError{http.StatusBadRequest, "InvalidAMIID.Malformed", fmt.Sprintf("Invalid id: %q (expecting \"ami-...\")", req.Image)})
	}
	if req.InstanceType = q.get("InstanceType"); req.InstanceType == "" {
		return fail(missing("InstanceType"))
	}
	var e *apiError
	if req.TEE, e = parseCPUOptions(q, req.InstanceType); e != nil {
		return fail(e)
	}
	for _, p := range []string{"MinCount", "MaxCount"} {
		_, ok, e := q.intParam(p, 1, 1)
		if !ok {
			return fail(missing(p))
		}
		if e != nil {
			return fail(invalidValue("This endpoint launches one instance per request: %s must be 1.", p))
		}
	}
	req.Token = q.get("ClientToken")
	if len(req.Token) > maxTokenBytes || strings.IndexFunc(req.Token, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0 {
		return fail(invalidValue("Value for parameter ClientToken is invalid: at most %d printable ASCII characters.", maxTokenBytes))
	}
	if v, ok := q["UserData"]; ok {
		data, err := base64.StdEncoding.DecodeString(v[0])
		if err != nil {
			return fail(invalidValue("Invalid BASE64 encoding of user data."))
		}
		if len(data) > maxUserData {
			return fail(invalidValue("User data is limited to %d bytes.", maxUserData))
		}
		req.UserData = data
	}

	l := &launch{subnetID: q.get("SubnetId"), groups: q.list("SecurityGroupId")}
	if v, ok := q["SubnetId"]; ok && !subnetPattern.MatchString(v[0]) {
		return fail(&apiError{http.StatusBadRequest, "InvalidSubnetID.Malformed", fmt.Sprintf("The subnet ID '%s' is malformed", v[0])})
	}
	for _, g := range l.groups {
		if !groupPattern.MatchString(g) {
			return fail(&apiError{http.StatusBadRequest, "InvalidGroupId.Malformed", fmt.Sprintf("Invalid id: %q (expecting \"sg-...\")", g)})
		}
	}
	if e := parseMetadataOptions(q, l); e != nil {
		return fail(e)
	}
	tags, e := parseTagSpecifications(q)
	if e != nil {
		return fail(e)
	}
	req.Tags = tags["instance"]
	req.Name = req.Tags["Name"]
	return req, l, tags, nil
}

func parseMetadataOptions(q query, l *launch) *apiError {
	l.httpTokens, l.httpEndpoint, l.hopLimit = "optional", "enabled", 1
	if v, ok := q["MetadataOptions.HttpTokens"]; ok {
		if v[0] != "optional" && v[0] != "required" {
			return invalidValue("The value '%s' is not valid for HttpTokens: use optional or required.", v[0])
		}
		l.httpTokens = v[0]
	}
	if v, ok := q["MetadataOptions.HttpEndpoint"]; ok {
		if v[0] != "enabled" && v[0] != "disabled" {
			return invalidValue("The value '%s' is not valid for HttpEndpoint: use enabled or disabled.", v[0])
		}
		l.httpEndpoint = v[0]
	}
	n, ok, e := q.intParam("MetadataOptions.HttpPutResponseHopLimit", 1, 64)
	if e != nil {
		return e
	}
	if ok {
		l.hopLimit = n
	}
	return nil
}

// parseTagSpecifications returns the tags by resource type.
func parseTagSpecifications(q query) (map[string]map[string]string, *apiError) {
	out := map[string]map[string]string{}
	for _, n := range q.indexes("TagSpecification") {
		prefix := "TagSpecification." + n
		rt := q.get(prefix + ".ResourceType")
		switch {
		case rt == "":
			return nil, missing(prefix + ".ResourceType")
		case rt != "instance" && rt != "volume":
			return nil, invalidValue("'%s' is not a valid taggable resource type for this operation.", rt)
		case out[rt] != nil:
			return nil, invalidValue("The resource type '%s' is given in more than one tag specification.", rt)
		}
		tags := map[string]string{}
		for _, m := range q.indexes(prefix + ".Tag") {
			key, has := q[prefix+".Tag."+m+".Key"]
			if !has || key[0] == "" {
				return nil, missing(prefix + ".Tag." + m + ".Key")
			}
			k, v := key[0], q.get(prefix+".Tag."+m+".Value")
			switch {
			case utf8.RuneCountInString(k) > maxTagKey:
				return nil, invalidValue("Tag key exceeds the maximum length of %d characters.", maxTagKey)
			case utf8.RuneCountInString(v) > maxTagValue:
				return nil, invalidValue("Tag value exceeds the maximum length of %d characters.", maxTagValue)
			case strings.HasPrefix(strings.ToLower(k), "aws:"):
				return nil, invalidValue("Tag keys starting with 'aws:' are reserved for internal use.")
			}
			if _, dup := tags[k]; dup {
				return nil, invalidValue("Duplicate tag key '%s' in the %s tag specification.", k, rt)
			}
			tags[k] = v
		}
		if len(tags) > maxTags {
			return nil, &apiError{http.StatusBadRequest, "TagLimitExceeded", fmt.Sprintf("The maximum number of tags per resource is %d.", maxTags)}
		}
		out[rt] = tags
	}
	return out, nil
}
