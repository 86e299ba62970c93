package vpcfake

// The JSON shapes of the VPC API that the fake reads and writes. They carry
// the fields the VPC Go SDK and caa's provider use, named as the API names
// them; the request shapes list every field the fake understands, so that
// anything else is refused as the API refuses an unknown field.

// Requests.

type idRef struct {
	ID string `json:"id"`
}

type nameRef struct {
	Name string `json:"name"`
}

type instancePrototype struct {
	Name                     string                     `json:"name"`
	Profile                  *nameRef                   `json:"profile"`
	Image                    *idRef                     `json:"image"`
	Zone                     *nameRef                   `json:"zone"`
	VPC                      *idRef                     `json:"vpc"`
	ResourceGroup            *idRef                     `json:"resource_group"`
	UserData                 *string                    `json:"user_data"`
	Keys                     []idRef                    `json:"keys"`
	BootVolumeAttachment     *bootVolumeAttachmentProto `json:"boot_volume_attachment"`
	PrimaryNetworkAttachment *networkAttachmentProto    `json:"primary_network_attachment"`
	PrimaryNetworkInterface  *networkInterfaceProto     `json:"primary_network_interface"`
	MetadataService          *metadataServiceProto      `json:"metadata_service"`
	ConfidentialComputeMode  string                     `json:"confidential_compute_mode"`
	EnableSecureBoot         *bool                      `json:"enable_secure_boot"`
}

type metadataServiceProto struct {
	Enabled  *bool  `json:"enabled"`
	Protocol string `json:"protocol"`
}

type bootVolumeAttachmentProto struct {
	DeleteVolumeOnInstanceDelete *bool        `json:"delete_volume_on_instance_delete"`
	Name                         string       `json:"name"`
	Volume                       *volumeProto `json:"volume"`
}

type volumeProto struct {
	Name          string   `json:"name"`
	Capacity      *int64   `json:"capacity"`
	Iops          *int64   `json:"iops"`
	Profile       *nameRef `json:"profile"`
	ResourceGroup *idRef   `json:"resource_group"`
	UserTags      []string `json:"user_tags"`
}

type networkAttachmentProto struct {
	Name                    string    `json:"name"`
	VirtualNetworkInterface *vniProto `json:"virtual_network_interface"`
}

type vniProto struct {
	Name                    string  `json:"name"`
	AutoDelete              *bool   `json:"auto_delete"`
	AllowIPSpoofing         *bool   `json:"allow_ip_spoofing"`
	EnableInfrastructureNat *bool   `json:"enable_infrastructure_nat"`
	ResourceGroup           *idRef  `json:"resource_group"`
	SecurityGroups          []idRef `json:"security_groups"`
	Subnet                  *idRef  `json:"subnet"`
}

type networkInterfaceProto struct {
	Name            string  `json:"name"`
	AllowIPSpoofing *bool   `json:"allow_ip_spoofing"`
	SecurityGroups  []idRef `json:"security_groups"`
	Subnet          *idRef  `json:"subnet"`
}

// Responses.

type problem struct {
	Errors     []problemItem `json:"errors"`
	Trace      string        `json:"trace"`
	StatusCode int           `json:"status_code"`
}

type problemItem struct {
	Code     string         `json:"code"`
	Message  string         `json:"message"`
	MoreInfo string         `json:"more_info,omitempty"`
	Target   *problemTarget `json:"target,omitempty"`
}

type problemTarget struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Value string `json:"value,omitempty"`
}

type link struct {
	Href string `json:"href"`
}

type ref struct {
	CRN          string `json:"crn,omitempty"`
	Href         string `json:"href"`
	ID           string `json:"id,omitempty"`
	Name         string `json:"name"`
	ResourceType string `json:"resource_type,omitempty"`
}

type reservedIP struct {
	Address      string `json:"address"`
	Href         string `json:"href"`
	ID           string `json:"id"`
	Name         string `json:"name"`
	ResourceType string `json:"resource_type"`
}

type nicRef struct {
	Href                    string     `json:"href"`
	ID                      string     `json:"id"`
	Name                    string     `json:"name"`
	PrimaryIP               reservedIP `json:"primary_ip"`
	ResourceType            string     `json:"resource_type"`
	Subnet                  ref        `json:"subnet"`
	VirtualNetworkInterface *ref       `json:"virtual_network_interface,omitempty"`
}

type volumeAttachmentRef struct {
	Device *struct {
		ID string `json:"id"`
	} `json:"device,omitempty"`
	Href   string `json:"href"`
	ID     string `json:"id"`
	Name   string `json:"name"`
	Volume *ref   `json:"volume,omitempty"`
}

type vcpu struct {
	Architecture string `json:"architecture"`
	Count        int64  `json:"count"`
	Manufacturer string `json:"manufacturer"`
}

type instanceView struct {
	ConfidentialComputeMode  string                `json:"confidential_compute_mode"`
	EnableSecureBoot         bool                  `json:"enable_secure_boot"`
	BootVolumeAttachment     volumeAttachmentRef   `json:"boot_volume_attachment"`
	CreatedAt                string                `json:"created_at"`
	CRN                      string                `json:"crn"`
	Href                     string                `json:"href"`
	ID                       string                `json:"id"`
	Image                    ref                   `json:"image"`
	LifecycleState           string                `json:"lifecycle_state"`
	LifecycleReasons         []any                 `json:"lifecycle_reasons"`
	Memory                   int64                 `json:"memory"`
	Name                     string                `json:"name"`
	NetworkAttachments       []nicRef              `json:"network_attachments"`
	NetworkInterfaces        []nicRef              `json:"network_interfaces"`
	PrimaryNetworkAttachment *nicRef               `json:"primary_network_attachment,omitempty"`
	PrimaryNetworkInterface  *nicRef               `json:"primary_network_interface,omitempty"`
	Profile                  ref                   `json:"profile"`
	ResourceGroup            ref                   `json:"resource_group"`
	ResourceType             string                `json:"resource_type"`
	Startable                bool                  `json:"startable"`
	Status                   string                `json:"status"`
	StatusReasons            []any                 `json:"status_reasons"`
	Vcpu                     vcpu                  `json:"vcpu"`
	VolumeAttachments        []volumeAttachmentRef `json:"volume_attachments"`
	VPC                      ref                   `json:"vpc"`
	Zone                     ref                   `json:"zone"`
}

type instanceCollection struct {
	First      link           `json:"first"`
	Instances  []instanceView `json:"instances"`
	Limit      int            `json:"limit"`
	Next       *link          `json:"next,omitempty"`
	TotalCount int            `json:"total_count"`
}

type volumeAttachmentVolumeContext struct {
	DeleteVolumeOnInstanceDelete bool `json:"delete_volume_on_instance_delete"`
	Device                       *struct {
		ID string `json:"id"`
	} `json:"device,omitempty"`
	Href     string `json:"href"`
	ID       string `json:"id"`
	Instance ref    `json:"instance"`
	Name     string `json:"name"`
	Type     string `json:"type"`
}

type volumeView struct {
	Active            bool                            `json:"active"`
	AttachmentState   string                          `json:"attachment_state"`
	Bandwidth         int64                           `json:"bandwidth"`
	Busy              bool                            `json:"busy"`
	Capacity          int64                           `json:"capacity"`
	CreatedAt         string                          `json:"created_at"`
	CRN               string                          `json:"crn"`
	Encryption        string                          `json:"encryption"`
	Href              string                          `json:"href"`
	ID                string                          `json:"id"`
	Iops              int64                           `json:"iops"`
	Name              string                          `json:"name"`
	Profile           ref                             `json:"profile"`
	ResourceGroup     ref                             `json:"resource_group"`
	ResourceType      string                          `json:"resource_type"`
	Status            string                          `json:"status"`
	StatusReasons     []any                           `json:"status_reasons"`
	UserTags          []string                        `json:"user_tags"`
	VolumeAttachments []volumeAttachmentVolumeContext `json:"volume_attachments"`
	Zone              ref                             `json:"zone"`
}

type volumeCollection struct {
	First      link         `json:"first"`
	Limit      int          `json:"limit"`
	Next       *link        `json:"next,omitempty"`
	TotalCount int          `json:"total_count"`
	Volumes    []volumeView `json:"volumes"`
}

type iamToken struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	Expiration   int64  `json:"expiration"`
	Scope        string `json:"scope"`
}

type iamProblem struct {
	ErrorCode    string            `json:"errorCode"`
	ErrorMessage string            `json:"errorMessage"`
	Context      map[string]string `json:"context"`
}
