package ec2fake

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"strings"
)

// The catalog reads a launching client may make before it launches:
// DescribeImages (an AMI's root device and its size, which a client needs
// to set a root volume size in RunInstances' BlockDeviceMapping) and
// DescribeInstanceTypes (a type's vCPUs and memory). Upstream peer-pods'
// AWS provider makes both at startup. They are reads of EC2's catalog, not
// of the account's instances: counted under OpCatalog, and not metered by
// WithBudget (EC2 meters them in its non-mutating class, which no client
// here spends). Sources: the EC2 API reference, DescribeImages and
// DescribeInstanceTypes (request parameters, response elements, the
// InvalidAMIID.NotFound and InvalidInstanceType error codes).

// imageRootSize is the root volume, in GiB, every AMI of the fake
// declares: that of Amazon's own Linux AMIs.
const imageRootSize = 8

// maxVolumeSize is EC2's largest gp2/gp3 volume, in GiB.
const maxVolumeSize = 16384

// typeSpecs are the instance types the fake describes: vCPUs and MiB, as
// EC2 publishes them (the instance types guide, general purpose and
// compute optimized).
var typeSpecs = map[string][2]int{
	"t3.small": {2, 2048}, "t3.medium": {2, 4096}, "t3.large": {2, 8192},
	"m5.large": {2, 8192}, "m5.xlarge": {4, 16384},
	"m6a.large": {2, 8192}, "m6a.xlarge": {4, 16384}, "m6a.2xlarge": {8, 32768},
	"m6i.large": {2, 8192}, "c6a.large": {2, 4096}, "c6a.xlarge": {4, 8192},
}

var (
	imagesParams = []string{"ImageId.#", "DryRun"}
	typesParams  = []string{"InstanceType.#", "DryRun"}
)

type describeImagesResponse struct {
	XMLName   xml.Name   `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeImagesResponse"`
	RequestID string     `xml:"requestId"`
	Images    []imageXML `xml:"imagesSet>item"`
}

type imageXML struct {
	ImageID        string           `xml:"imageId"`
	State          string           `xml:"imageState"`
	OwnerID        string           `xml:"imageOwnerId"`
	Architecture   string           `xml:"architecture"`
	RootDeviceType string           `xml:"rootDeviceType"`
	RootDeviceName string           `xml:"rootDeviceName"`
	BlockDevices   []imageDeviceXML `xml:"blockDeviceMapping>item"`
}

type imageDeviceXML struct {
	DeviceName string `xml:"deviceName"`
	EBS        struct {
		VolumeSize          int  `xml:"volumeSize"`
		DeleteOnTermination bool `xml:"deleteOnTermination"`
	} `xml:"ebs"`
}

type describeInstanceTypesResponse struct {
	XMLName   xml.Name          `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstanceTypesResponse"`
	RequestID string            `xml:"requestId"`
	Types     []instanceTypeXML `xml:"instanceTypeSet>item"`
}

type instanceTypeXML struct {
	InstanceType string `xml:"instanceType"`
	VCPUs        int    `xml:"vCpuInfo>defaultVCpus"`
	MemoryMiB    int    `xml:"memoryInfo>sizeInMiB"`
}

// describeImages answers for the AMIs named: each has the root device and
// size every launch of the fake gets. An AMI the core does not offer (when
// its options restrict them) is InvalidAMIID.NotFound, as EC2 answers an
// AMI the account cannot see.
func (s *server) describeImages(q query, c caller) (any, *apiError) {
	if e := q.check(imagesParams...); e != nil {
		return nil, e
	}
	dry, e := dryRun(q)
	if e != nil {
		return nil, e
	}
	if e := s.authorize(c, []check{{"ec2:DescribeImages", "*", map[string][]string{"aws:RequestedRegion": {c.region}}}}); e != nil {
		return nil, e
	}
	if dry {
		return nil, dryRunOK
	}
	ids := q.list("ImageId")
	if len(ids) == 0 {
		// The fake lists no public catalog: a caller names its AMIs.
		return nil, invalidValue("This endpoint describes named images only: give ImageId.N.")
	}
	resp := describeImagesResponse{RequestID: s.requestID()}
	for _, id := range ids {
		if !imagePattern.MatchString(id) {
			return nil, &apiError{http.StatusBadRequest, "InvalidAMIID.Malformed", fmt.Sprintf("Invalid id: %q (expecting \"ami-...\")", id)}
		}
		if err := s.cloud.CheckSpec(id, ""); err != nil {
			return nil, &apiError{http.StatusBadRequest, "InvalidAMIID.NotFound", fmt.Sprintf("The image id '[%s]' does not exist", id)}
		}
		im := imageXML{ImageID: id, State: "available", OwnerID: ownerID, Architecture: "x86_64", RootDeviceType: "ebs", RootDeviceName: rootDevice}
		var d imageDeviceXML
		d.DeviceName = rootDevice
		d.EBS.VolumeSize, d.EBS.DeleteOnTermination = imageRootSize, true
		im.BlockDevices = []imageDeviceXML{d}
		resp.Images = append(resp.Images, im)
	}
	return resp, nil
}

// describeInstanceTypes answers for the types named, from typeSpecs. A
// type the fake does not describe, or one the core does not offer, is
// InvalidInstanceType, as EC2 answers a name it does not know.
func (s *server) describeInstanceTypes(q query, c caller) (any, *apiError) {
	if e := q.check(typesParams...); e != nil {
		return nil, e
	}
	dry, e := dryRun(q)
	if e != nil {
		return nil, e
	}
	if e := s.authorize(c, []check{{"ec2:DescribeInstanceTypes", "*", map[string][]string{"aws:RequestedRegion": {c.region}}}}); e != nil {
		return nil, e
	}
	if dry {
		return nil, dryRunOK
	}
	names := q.list("InstanceType")
	if len(names) == 0 {
		return nil, invalidValue("This endpoint describes named instance types only: give InstanceType.N.")
	}
	resp := describeInstanceTypesResponse{RequestID: s.requestID()}
	var unknown []string
	for _, n := range names {
		spec, ok := typeSpecs[n]
		if !ok || s.cloud.CheckSpec("", n) != nil {
			unknown = append(unknown, n)
			continue
		}
		resp.Types = append(resp.Types, instanceTypeXML{InstanceType: n, VCPUs: spec[0], MemoryMiB: spec[1]})
	}
	if len(unknown) > 0 {
		return nil, &apiError{http.StatusBadRequest, "InvalidInstanceType",
			fmt.Sprintf("The following supplied instance types do not exist: [%s]", strings.Join(unknown, ", "))}
	}
	return resp, nil
}

// parseBlockDevices reads RunInstances' BlockDeviceMapping: the fake has
// one volume per instance, its root, so a mapping may only size the root
// device, and the size must be at least the AMI's (EC2's
// InvalidBlockDeviceMapping otherwise). It returns the root's size in GiB
// (0: the AMI's).
func parseBlockDevices(q query) (int, *apiError) {
	size := 0
	for _, n := range q.indexes("BlockDeviceMapping") {
		prefix := "BlockDeviceMapping." + n
		dev := q.get(prefix + ".DeviceName")
		switch {
		case dev == "":
			return 0, missing(prefix + ".DeviceName")
		case dev != rootDevice:
			return 0, invalidValue("This endpoint maps the root device (%s) only, not %s.", rootDevice, dev)
		}
		v, ok, e := q.intParam(prefix+".Ebs.VolumeSize", 1, maxVolumeSize)
		if e != nil {
			return 0, e
		}
		if ok && v < imageRootSize {
			return 0, &apiError{http.StatusBadRequest, "InvalidBlockDeviceMapping",
				fmt.Sprintf("Volume of size %dGB is smaller than snapshot, expect size >= %dGB", v, imageRootSize)}
		}
		if ok {
			size = v
		}
	}
	return size, nil
}
