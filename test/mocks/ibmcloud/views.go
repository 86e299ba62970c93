package vpcfake

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The VPC, subnet and resource group shown for an instance whose request
// named none, and for instances seeded straight into the core. A provider
// configured with them sees seeded instances as its own.
const (
	DefaultVPC           = "r006-fake-vpc"
	DefaultSubnet        = "0717-fake-subnet"
	DefaultResourceGroup = "fake-resource-group"
)

const (
	crnPrefix = "crn:v1:bluemix:public:is:"
	account   = ":a/fakeaccount::"
)

// statusOf maps a core state onto the VPC instance status.
func statusOf(s provider.State) string {
	switch s {
	case provider.StatePending:
		return "pending"
	case provider.StateRunning:
		return "running"
	case provider.StateStopping:
		return "stopping"
	case provider.StateStopped:
		return "stopped"
	case provider.StateTerminated:
		return "deleting"
	case provider.StateFailed:
		return "failed"
	default:
		return "pending"
	}
}

var profileRE = regexp.MustCompile(`^[a-z0-9]+-(\d+)x(\d+)`)

// shapeOf reads vCPUs and GiB of memory from a profile name like bx2-2x8.
func shapeOf(profile string) (cpus, mem int64) {
	m := profileRE.FindStringSubmatch(profile)
	if m == nil {
		return 0, 0
	}
	cpus, _ = strconv.ParseInt(m[1], 10, 64)
	mem, _ = strconv.ParseInt(m[2], 10, 64)
	return cpus, mem
}

// sideOf finds the instance's side resource of one kind.
func sideOf(in cloud.Instance, byID map[string]cloud.Resource, kinds ...string) (cloud.Resource, bool) {
	for _, id := range in.Resources {
		if r, ok := byID[id]; ok && slices.Contains(kinds, r.Kind) {
			return r, true
		}
	}
	return cloud.Resource{}, false
}

func nicOf(in cloud.Instance, byID map[string]cloud.Resource) cloud.Resource {
	r, ok := sideOf(in, byID, KindVNI, KindNetworkInterface)
	if !ok {
		// A seeded instance: a legacy interface on the default subnet.
		return cloud.Resource{ID: in.ID + "-nic", Kind: KindNetworkInterface, Props: map[string]string{}}
	}
	return r
}

func propOr(r cloud.Resource, key, def string) string {
	if v := r.Props[key]; v != "" {
		return v
	}
	return def
}

func vpcOf(nic cloud.Resource) string   { return propOr(nic, "vpc", DefaultVPC) }
func groupOf(nic cloud.Resource) string { return propOr(nic, "resource_group", DefaultResourceGroup) }

func instanceViewOf(base string, in cloud.Instance, byID map[string]cloud.Resource) instanceView {
	nic := nicOf(in, byID)
	zone := propOr(nic, "zone", in.Zone)
	href := base + "/v1/instances/" + in.ID
	cpus, mem := shapeOf(in.InstanceType)
	ip := ""
	if len(in.IPs) > 0 {
		ip = in.IPs[0]
	}
	subnetID := propOr(nic, "subnet", DefaultSubnet)
	n := nicRef{
		ID: nic.ID, Name: propOr(nic, "attachment_name", nic.Name),
		PrimaryIP: reservedIP{Address: ip, Href: base + "/v1/subnets/" + subnetID + "/reserved_ips/" + nic.ID + "-ip",
			ID: nic.ID + "-ip", Name: nic.ID + "-ip", ResourceType: "subnet_reserved_ip"},
		Subnet: ref{CRN: crnPrefix + zone + account + "subnet:" + subnetID, Href: base + "/v1/subnets/" + subnetID,
			ID: subnetID, Name: subnetID, ResourceType: "subnet"},
	}
	lifecycle := "stable"
	switch in.State {
	case provider.StatePending:
		lifecycle = "pending"
	case provider.StateTerminated:
		lifecycle = "deleting"
	}
	v := instanceView{
		CreatedAt:               in.CreatedAt.UTC().Format(time.RFC3339),
		ConfidentialComputeMode: modeOf(in.TEE),
		EnableSecureBoot:        in.TEE == "tdx",
		CRN:                     crnPrefix + zone + account + "instance:" + in.ID,
		Href:                    href,
		ID:                      in.ID,
		Image:                   ref{CRN: crnPrefix + account + "image:" + in.Image, Href: base + "/v1/images/" + in.Image, ID: in.Image, Name: in.Image, ResourceType: "image"},
		LifecycleState:          lifecycle,
		LifecycleReasons:        []any{},
		Memory:                  mem,
		Name:                    in.Name,
		NetworkAttachments:      []nicRef{},
		NetworkInterfaces:       []nicRef{},
		Profile:                 ref{Href: base + "/v1/instance/profiles/" + in.InstanceType, Name: in.InstanceType},
		ResourceGroup:           ref{Href: "https://resource-controller.cloud.ibm.com/v2/resource_groups/" + groupOf(nic), ID: groupOf(nic), Name: groupOf(nic)},
		ResourceType:            "instance",
		Startable:               in.State == provider.StateStopped,
		Status:                  statusOf(in.State),
		StatusReasons:           []any{},
		Vcpu:                    vcpu{Architecture: "amd64", Count: cpus, Manufacturer: "intel"},
		VPC:                     ref{CRN: crnPrefix + account + "vpc:" + vpcOf(nic), Href: base + "/v1/vpcs/" + vpcOf(nic), ID: vpcOf(nic), Name: vpcOf(nic), ResourceType: "vpc"},
		Zone:                    ref{Href: base + "/v1/regions/fake/zones/" + zone, Name: zone},
	}
	if nic.Kind == KindVNI {
		attID := nic.Props["attachment_id"]
		n.Href, n.ID, n.ResourceType = href+"/network_attachments/"+attID, attID, "instance_network_attachment"
		n.VirtualNetworkInterface = &ref{CRN: crnPrefix + zone + account + "virtual-network-interface:" + nic.ID,
			Href: base + "/v1/virtual_network_interfaces/" + nic.ID, ID: nic.ID, Name: nic.Name, ResourceType: "virtual_network_interface"}
		v.PrimaryNetworkAttachment = &n
		v.NetworkAttachments = []nicRef{n}
	} else {
		n.Href, n.ResourceType = href+"/network_interfaces/"+nic.ID, "network_interface"
		v.PrimaryNetworkInterface = &n
		v.NetworkInterfaces = []nicRef{n}
	}
	bv := bootVolumeOf(in, byID)
	att := volumeAttachmentRef{Href: href + "/volume_attachments/" + bv.attachmentID, ID: bv.attachmentID, Name: bv.attachmentName,
		Volume: &ref{CRN: bv.crn(zone), Href: base + "/v1/volumes/" + bv.id, ID: bv.id, Name: bv.name, ResourceType: "volume"}}
	att.Device = &struct {
		ID string `json:"id"`
	}{ID: bv.attachmentID + "-device"}
	v.BootVolumeAttachment = att
	v.VolumeAttachments = []volumeAttachmentRef{att}
	return v
}

// bootVolume is what the fake knows of an instance's boot volume, from its
// core resource or, for a seeded instance, from the instance itself.
type bootVolume struct {
	id, name, profile, zone, group string
	attachmentID, attachmentName   string
	capacity                       int64
	deleteWithInstance             bool
	tags                           map[string]string
}

func (b bootVolume) crn(zone string) string { return crnPrefix + zone + account + "volume:" + b.id }

func bootVolumeOf(in cloud.Instance, byID map[string]cloud.Resource) bootVolume {
	if r, ok := sideOf(in, byID, KindVolume); ok {
		return volumeFromResource(r)
	}
	return bootVolume{
		id: in.ID + "-boot", name: in.Name + "-boot", profile: "general-purpose", zone: in.Zone, group: DefaultResourceGroup,
		attachmentID: in.ID + "-boot-attachment", attachmentName: in.Name + "-boot-attachment",
		capacity: defaultCapacity, deleteWithInstance: true, tags: in.Tags,
	}
}

func volumeFromResource(r cloud.Resource) bootVolume {
	capacity, _ := strconv.ParseInt(r.Props["capacity"], 10, 64)
	name := r.Name
	if name == "" {
		name = r.ID
	}
	return bootVolume{
		id: r.ID, name: name, profile: r.Props["profile"], zone: r.Props["zone"], group: propOr(r, "resource_group", DefaultResourceGroup),
		attachmentID: r.Props["attachment_id"], attachmentName: propOr(r, "attachment_name", r.Props["attachment_id"]),
		capacity: capacity, deleteWithInstance: r.Props["delete_volume_on_instance_delete"] == "true", tags: r.Tags,
	}
}

// volumeViewOf shows a boot volume; owner is the instance it is attached
// to, nil when it is not attached.
func volumeViewOf(base string, b bootVolume, owner *cloud.Instance) volumeView {
	zone := b.zone
	if zone == "" && owner != nil {
		zone = owner.Zone
	}
	v := volumeView{
		Active: owner != nil, AttachmentState: "unattached", Bandwidth: 393, Capacity: b.capacity,
		CRN: b.crn(zone), Encryption: "provider_managed", Href: base + "/v1/volumes/" + b.id, ID: b.id, Iops: 3000, Name: b.name,
		Profile:       ref{Href: base + "/v1/volume/profiles/" + b.profile, Name: b.profile},
		ResourceGroup: ref{Href: "https://resource-controller.cloud.ibm.com/v2/resource_groups/" + b.group, ID: b.group, Name: b.group},
		ResourceType:  "volume", Status: "available", StatusReasons: []any{}, UserTags: formatUserTags(b.tags),
		VolumeAttachments: []volumeAttachmentVolumeContext{},
		Zone:              ref{Href: base + "/v1/regions/fake/zones/" + zone, Name: zone},
	}
	if owner != nil {
		v.AttachmentState = "attached"
		v.CreatedAt = owner.CreatedAt.UTC().Format(time.RFC3339)
		att := volumeAttachmentVolumeContext{
			DeleteVolumeOnInstanceDelete: b.deleteWithInstance,
			Href:                         base + "/v1/instances/" + owner.ID + "/volume_attachments/" + b.attachmentID,
			ID:                           b.attachmentID, Name: b.attachmentName, Type: "boot",
			Instance: ref{CRN: crnPrefix + zone + account + "instance:" + owner.ID, Href: base + "/v1/instances/" + owner.ID, ID: owner.ID, Name: owner.Name},
		}
		att.Device = &struct {
			ID string `json:"id"`
		}{ID: b.attachmentID + "-device"}
		v.VolumeAttachments = append(v.VolumeAttachments, att)
	}
	return v
}

// parseUserTags reads user tags as IBM Cloud shows them: lower case, and
// "key:value" split at the first colon (a tag without one has an empty
// value).
func parseUserTags(tags []string) map[string]string {
	out := make(map[string]string, len(tags))
	for _, t := range tags {
		k, v, _ := strings.Cut(strings.ToLower(t), ":")
		out[k] = v
	}
	return out
}

// formatUserTags writes tags back as "key:value" strings, sorted.
func formatUserTags(tags map[string]string) []string {
	out := make([]string, 0, len(tags))
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		if tags[k] == "" {
			out = append(out, k)
		} else {
			out = append(out, k+":"+tags[k])
		}
	}
	return out
}
