package armfake

import (
	"strings"
	"time"
)

// The ARM JSON shapes the fake reads and writes: its own declarations, not
// the SDK's, so that the wire format is checked from both sides. Only the
// members caa uses are declared; decodeStrict refuses the others, as the
// resource providers do.

type vmWire struct {
	ID         string            `json:"id,omitempty"`
	Name       string            `json:"name,omitempty"`
	Type       string            `json:"type,omitempty"`
	Location   string            `json:"location"`
	Tags       map[string]string `json:"tags,omitempty"`
	Zones      []string          `json:"zones,omitempty"`
	Properties *vmProperties     `json:"properties"`
}

type vmProperties struct {
	HardwareProfile *hardwareProfile `json:"hardwareProfile,omitempty"`
	StorageProfile  *storageProfile  `json:"storageProfile,omitempty"`
	OSProfile       *osProfile       `json:"osProfile,omitempty"`
	NetworkProfile  *networkProfile  `json:"networkProfile,omitempty"`
	// UserData is what the VM's IMDS serves as compute/userData (base64);
	// ARM shows it only on a GET with $expand=userData.
	UserData          string           `json:"userData,omitempty"`
	ProvisioningState string           `json:"provisioningState,omitempty"`
	VMID              string           `json:"vmId,omitempty"`
	TimeCreated       *time.Time       `json:"timeCreated,omitempty"`
	InstanceView      *instanceView    `json:"instanceView,omitempty"`
	SecurityProfile   *securityProfile `json:"securityProfile,omitempty"`
}

type hardwareProfile struct {
	VMSize string `json:"vmSize"`
}

type storageProfile struct {
	ImageReference *imageReference `json:"imageReference,omitempty"`
	OSDisk         *osDisk         `json:"osDisk,omitempty"`
}

type imageReference struct {
	ID                      string `json:"id,omitempty"`
	SharedGalleryImageID    string `json:"sharedGalleryImageId,omitempty"`
	CommunityGalleryImageID string `json:"communityGalleryImageId,omitempty"`
	Publisher               string `json:"publisher,omitempty"`
	Offer                   string `json:"offer,omitempty"`
	SKU                     string `json:"sku,omitempty"`
	Version                 string `json:"version,omitempty"`
}

type osDisk struct {
	Name         string       `json:"name,omitempty"`
	CreateOption string       `json:"createOption"`
	DeleteOption string       `json:"deleteOption,omitempty"`
	OSType       string       `json:"osType,omitempty"`
	Caching      string       `json:"caching,omitempty"`
	DiskSizeGB   int          `json:"diskSizeGB,omitempty"`
	ManagedDisk  *managedDisk `json:"managedDisk,omitempty"`
}

type managedDisk struct {
	ID                 string               `json:"id,omitempty"`
	StorageAccountType string               `json:"storageAccountType,omitempty"`
	SecurityProfile    *diskSecurityProfile `json:"securityProfile,omitempty"`
}

type osProfile struct {
	ComputerName       string              `json:"computerName"`
	AdminUsername      string              `json:"adminUsername"`
	AdminPassword      string              `json:"adminPassword,omitempty"`
	CustomData         string              `json:"customData,omitempty"`
	LinuxConfiguration *linuxConfiguration `json:"linuxConfiguration,omitempty"`
}

type linuxConfiguration struct {
	DisablePasswordAuthentication *bool             `json:"disablePasswordAuthentication,omitempty"`
	ProvisionVMAgent              *bool             `json:"provisionVMAgent,omitempty"`
	SSH                           *sshConfiguration `json:"ssh,omitempty"`
}

type sshConfiguration struct {
	PublicKeys []sshPublicKey `json:"publicKeys"`
}

type sshPublicKey struct {
	Path    string `json:"path"`
	KeyData string `json:"keyData"`
}

type networkProfile struct {
	NetworkInterfaces []nicReference `json:"networkInterfaces"`
}

type nicReference struct {
	ID         string            `json:"id"`
	Properties *nicRefProperties `json:"properties,omitempty"`
}

type nicRefProperties struct {
	Primary      *bool  `json:"primary,omitempty"`
	DeleteOption string `json:"deleteOption,omitempty"`
}

type instanceView struct {
	ComputerName string           `json:"computerName,omitempty"`
	Statuses     []instanceStatus `json:"statuses"`
}

type instanceStatus struct {
	Code          string `json:"code"`
	Level         string `json:"level"`
	DisplayStatus string `json:"displayStatus"`
}

type vmList struct {
	Value    []vmWire `json:"value"`
	NextLink string   `json:"nextLink,omitempty"`
}

type nicWire struct {
	ID         string            `json:"id,omitempty"`
	Name       string            `json:"name,omitempty"`
	Type       string            `json:"type,omitempty"`
	Location   string            `json:"location"`
	Tags       map[string]string `json:"tags,omitempty"`
	Properties *nicProperties    `json:"properties"`
}

type nicProperties struct {
	IPConfigurations     []ipConfiguration `json:"ipConfigurations"`
	NetworkSecurityGroup *subResource      `json:"networkSecurityGroup,omitempty"`
	VirtualMachine       *subResource      `json:"virtualMachine,omitempty"`
	Primary              *bool             `json:"primary,omitempty"`
	ProvisioningState    string            `json:"provisioningState,omitempty"`
}

type ipConfiguration struct {
	ID         string                     `json:"id,omitempty"`
	Name       string                     `json:"name"`
	Properties *ipConfigurationProperties `json:"properties"`
}

type ipConfigurationProperties struct {
	Subnet                    *subResource `json:"subnet"`
	PrivateIPAllocationMethod string       `json:"privateIPAllocationMethod,omitempty"`
	PrivateIPAddress          string       `json:"privateIPAddress,omitempty"`
	PrivateIPAddressVersion   string       `json:"privateIPAddressVersion,omitempty"`
	Primary                   *bool        `json:"primary,omitempty"`
	ProvisioningState         string       `json:"provisioningState,omitempty"`
}

type subResource struct {
	ID string `json:"id"`
}

type nicList struct {
	Value    []nicWire `json:"value"`
	NextLink string    `json:"nextLink,omitempty"`
}

// operationStatus is the body of an Azure-AsyncOperation URL.
type operationStatus struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Status    string    `json:"status"`
	StartTime time.Time `json:"startTime"`
	EndTime   time.Time `json:"endTime,omitzero"`
	Error     *apiError `json:"error,omitempty"`
}

// The image forms ARM accepts, stored in the core as one string: an image
// resource id, a shared or community gallery id, or publisher:offer:sku:version.

func (ref imageReference) String() string {
	switch {
	case ref.ID != "":
		return ref.ID
	case ref.SharedGalleryImageID != "":
		return ref.SharedGalleryImageID
	case ref.CommunityGalleryImageID != "":
		return ref.CommunityGalleryImageID
	}
	return strings.Join([]string{ref.Publisher, ref.Offer, ref.SKU, ref.Version}, ":")
}

// forms counts how many of the image forms ref sets, and whether the
// platform form is complete.
func (ref imageReference) forms() (n int, platformComplete bool) {
	for _, v := range []string{ref.ID, ref.SharedGalleryImageID, ref.CommunityGalleryImageID} {
		if v != "" {
			n++
		}
	}
	if ref.Publisher != "" || ref.Offer != "" || ref.SKU != "" || ref.Version != "" {
		n++
		platformComplete = ref.Publisher != "" && ref.Offer != "" && ref.SKU != "" && ref.Version != ""
	}
	return n, platformComplete
}

func isPlatformImage(s string) bool {
	parts := strings.Split(s, ":")
	return !strings.HasPrefix(s, "/") && len(parts) == 4 && !strings.Contains(s, "::") && parts[0] != "" && parts[3] != ""
}

// imageRefOf is the inverse of String, for images the core holds.
func imageRefOf(s string) *imageReference {
	lower := strings.ToLower(s)
	switch {
	case strings.HasPrefix(lower, "/sharedgalleries/"):
		return &imageReference{SharedGalleryImageID: s}
	case strings.HasPrefix(lower, "/communitygalleries/"):
		return &imageReference{CommunityGalleryImageID: s}
	case isPlatformImage(s):
		p := strings.Split(s, ":")
		return &imageReference{Publisher: p[0], Offer: p[1], SKU: p[2], Version: p[3]}
	}
	return &imageReference{ID: s}
}
