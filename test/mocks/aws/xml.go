package ec2fake

import (
	"encoding/xml"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The response documents, element for element as the SDK's deserializers
// read them (EC2 lists are <xxxSet><item>...</item></xxxSet>).

type runInstancesResponse struct {
	XMLName       xml.Name      `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ RunInstancesResponse"`
	RequestID     string        `xml:"requestId"`
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Groups        groupSet      `xml:"groupSet"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName      xml.Name       `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstancesResponse"`
	RequestID    string         `xml:"requestId"`
	Reservations reservationSet `xml:"reservationSet"`
	NextToken    string         `xml:"nextToken,omitempty"`
}

type reservationSet struct {
	Items []reservationXML `xml:"item"`
	// Encoded, when set instead of Items, is the items already encoded:
	// a listing's answer made before (the server's answers memo).
	Encoded string `xml:",innerxml"`
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Groups        groupSet      `xml:"groupSet"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type terminateInstancesResponse struct {
	XMLName   xml.Name         `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ TerminateInstancesResponse"`
	RequestID string           `xml:"requestId"`
	Changes   []stateChangeXML `xml:"instancesSet>item"`
}

type stateChangeXML struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  stateXML `xml:"currentState"`
	PreviousState stateXML `xml:"previousState"`
}

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type stateReasonXML struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type groupSet struct {
	Items []groupXML `xml:"item"`
}

type groupXML struct {
	GroupID string `xml:"groupId"`
}

type tagSet struct {
	Items []tagXML `xml:"item"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type blockDeviceXML struct {
	DeviceName string `xml:"deviceName"`
	EBS        struct {
		VolumeID            string `xml:"volumeId"`
		Status              string `xml:"status"`
		AttachTime          string `xml:"attachTime"`
		DeleteOnTermination bool   `xml:"deleteOnTermination"`
	} `xml:"ebs"`
}

type metadataOptionsXML struct {
	State                   string `xml:"state"`
	HTTPTokens              string `xml:"httpTokens"`
	HTTPPutResponseHopLimit int    `xml:"httpPutResponseHopLimit"`
	HTTPEndpoint            string `xml:"httpEndpoint"`
}

type instanceXML struct {
	InstanceID     string              `xml:"instanceId"`
	ImageID        string              `xml:"imageId"`
	State          stateXML            `xml:"instanceState"`
	PrivateDNSName string              `xml:"privateDnsName"`
	AMILaunchIndex int                 `xml:"amiLaunchIndex"`
	InstanceType   string              `xml:"instanceType"`
	LaunchTime     string              `xml:"launchTime"`
	Zone           string              `xml:"placement>availabilityZone"`
	SubnetID       string              `xml:"subnetId,omitempty"`
	PrivateIP      string              `xml:"privateIpAddress,omitempty"`
	Groups         groupSet            `xml:"groupSet"`
	StateReason    *stateReasonXML     `xml:"stateReason,omitempty"`
	RootDeviceType string              `xml:"rootDeviceType"`
	RootDeviceName string              `xml:"rootDeviceName,omitempty"`
	BlockDevices   []blockDeviceXML    `xml:"blockDeviceMapping>item"`
	ClientToken    string              `xml:"clientToken"`
	Tags           tagSet              `xml:"tagSet"`
	Metadata       *metadataOptionsXML `xml:"metadataOptions,omitempty"`
	CPUOptions     *cpuOptionsXML      `xml:"cpuOptions,omitempty"`
	NICs           []nicXML            `xml:"networkInterfaceSet>item"`
}

// nicXML is an instance's primary network interface, as EC2 lists it in
// RunInstances' and DescribeInstances' answers (clients that read the
// address per interface, as upstream peer-pods' provider does, find it
// here).
type nicXML struct {
	ID         string `xml:"networkInterfaceId"`
	SubnetID   string `xml:"subnetId,omitempty"`
	Status     string `xml:"status"`
	PrivateIP  string `xml:"privateIpAddress"`
	Attachment struct {
		DeviceIndex int    `xml:"deviceIndex"`
		Status      string `xml:"status"`
	} `xml:"attachment"`
}

// ec2State is EC2's name and code for a core state. EC2 has no "failed but
// present" state: an instance that failed at launch shows as terminated
// with a Server.* state reason (see stateReason), which the provider reads
// as Failed. The core keeps a failed instance listed until it is deleted,
// where EC2 drops it after about an hour; deleting it is a no-op for EC2
// and removes its volume here. A deallocated instance is plainly stopped.
func ec2State(s provider.State) stateXML {
	switch s {
	case provider.StateRunning:
		return stateXML{16, "running"}
	case provider.StateStopping:
		return stateXML{64, "stopping"}
	case provider.StateStopped:
		return stateXML{80, "stopped"}
	case provider.StateTerminated, provider.StateFailed:
		return stateXML{48, "terminated"}
	}
	// Pending, and Unknown, which the core never sets: pending is the
	// state that commits to nothing.
	return stateXML{0, "pending"}
}

func stateReason(s provider.State) *stateReasonXML {
	switch s {
	case provider.StateFailed:
		return &stateReasonXML{"Server.InternalError", "Server.InternalError: Internal error on launch"}
	case provider.StateTerminated, provider.StateStopped:
		return &stateReasonXML{"Client.UserInitiatedShutdown", "Client.UserInitiatedShutdown: User initiated shutdown"}
	}
	return nil
}

// timestamp is EC2's ISO 8601 form with milliseconds.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func reservationID(instanceID string) string { return "r-" + strings.TrimPrefix(instanceID, "i-") }

// renderInstance is the <item> of one instance; l holds what RunInstances
// was asked for, when the instance was made through this front end.
func renderInstance(in cloud.Instance, l *launch) instanceXML {
	x := instanceXML{
		InstanceID:     in.ID,
		ImageID:        in.Image,
		State:          ec2State(in.State),
		InstanceType:   in.InstanceType,
		LaunchTime:     timestamp(in.CreatedAt),
		Zone:           in.Zone,
		StateReason:    stateReason(in.State),
		RootDeviceType: "ebs",
		ClientToken:    in.Token,
		CPUOptions:     renderCPUOptions(in.TEE),
	}
	if len(in.IPs) > 0 && in.State != provider.StateTerminated {
		x.PrivateIP = in.IPs[0]
		x.PrivateDNSName = "ip-" + strings.ReplaceAll(in.IPs[0], ".", "-") + ".ec2.internal"
		nic := nicXML{ID: "eni-" + strings.TrimPrefix(in.ID, "i-"), Status: "in-use", PrivateIP: in.IPs[0]}
		nic.Attachment.Status = "attached"
		if l != nil {
			nic.SubnetID = l.subnetID
		}
		x.NICs = []nicXML{nic}
	}
	for _, k := range slices.Sorted(maps.Keys(in.Tags)) {
		x.Tags.Items = append(x.Tags.Items, tagXML{k, in.Tags[k]})
	}
	if l == nil {
		return x
	}
	x.SubnetID = l.subnetID
	for _, g := range l.groups {
		x.Groups.Items = append(x.Groups.Items, groupXML{g})
	}
	x.Metadata = &metadataOptionsXML{State: "applied", HTTPTokens: l.httpTokens, HTTPPutResponseHopLimit: l.hopLimit, HTTPEndpoint: l.httpEndpoint}
	x.RootDeviceName = rootDevice
	if in.State != provider.StateTerminated && slices.Contains(in.Resources, l.volumeID) {
		var bd blockDeviceXML
		bd.DeviceName = rootDevice
		bd.EBS.VolumeID, bd.EBS.Status, bd.EBS.AttachTime, bd.EBS.DeleteOnTermination = l.volumeID, "attached", timestamp(in.CreatedAt), true
		x.BlockDevices = []blockDeviceXML{bd}
	}
	return x
}
