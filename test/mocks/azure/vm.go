package armfake

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	vmType   = "Microsoft.Compute/virtualMachines"
	diskType = "Microsoft.Compute/disks"
	nicType  = "Microsoft.Network/networkInterfaces"
)

// vmMeta is what ARM shows of a VM that the core does not hold. Instances
// made directly on the core have none and show defaults.
type vmMeta struct {
	location string
	zones    []string
	os       *osProfile // without customData or password
	// customData is osProfile.customData, decoded: kept apart from the
	// user data, as Azure keeps it, and never served by the IMDS.
	customData []byte
	osDisk     *osDisk
	nics       []nicReference
	// createdAt is when the fake took the VM's create, on its clock
	// (WithCreateDuration); extensionFailed marks a VM whose extension
	// failed (WithFailingPolicyExtension, FailExtension).
	createdAt       time.Time
	extensionFailed bool
	// secureBoot is the VM's securityProfile.uefiSettings.secureBootEnabled.
	secureBoot bool
}

// putVM creates a VM, or answers for the live one of that name: an
// identical PUT is a no-op update, a changed image or size is refused, and
// If-None-Match: * refuses any existing VM.
func (s *server) putVM(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if e := checkName(name, "virtual machine", vmNameRE); e != nil {
		writeError(w, *e)
		return
	}
	var body vmWire
	if e := decodeStrict(r, &body); e != nil {
		writeError(w, *e)
		return
	}
	ifNoneMatch := r.Header.Get("If-None-Match")
	if ifNoneMatch != "" && ifNoneMatch != "*" {
		writeError(w, *invalidParameter("If-None-Match", "Only '*' is supported in If-None-Match."))
		return
	}
	req, meta, e := s.parseVM(name, body)
	if e != nil {
		writeError(w, *e)
		return
	}
	for _, ref := range meta.nics {
		if e := s.authorizeLinked("Microsoft.Compute/virtualMachines/write", r.URL.Path,
			"Microsoft.Network/networkInterfaces/join/action", ref.ID); e != nil {
			writeError(w, *e)
			return
		}
	}
	// The OS disk a VM's create makes from the image is a resource of the
	// caller's, made on its behalf: the write on it is checked too. No
	// Microsoft reference page lists the VM's linked access checks; the
	// disks actions are what operators report a custom role needs for VMs
	// with managed disks (MicrosoftDocs/azure-docs issues 6250 and 31800)
	// and what other VM managers' roles grant (karpenter-provider-azure,
	// Gardener's and OpenShift's Azure permission lists).
	if e := s.authorizeLinked("Microsoft.Compute/virtualMachines/write", r.URL.Path,
		"Microsoft.Compute/disks/write", meta.osDisk.ManagedDisk.ID); e != nil {
		writeError(w, *e)
		return
	}

	s.writes.Lock()
	defer s.writes.Unlock()
	if in, ok := s.lookup(name); ok {
		req.Name = in.Name // ARM names are case-insensitive; the core's are not
	}
	disk := cloud.Resource{ID: key(meta.osDisk.ManagedDisk.ID), Kind: diskType, Name: meta.osDisk.Name,
		Tags: body.Tags, Props: map[string]string{"location": meta.location}}
	_, err := s.cloud.GetResource(disk.ID)
	newDisk := errors.Is(err, cloud.ErrResourceNotFound)
	if newDisk {
		s.cloud.PutResource(disk)
	}
	req.Resources = append(req.Resources, disk.ID)
	if meta.osDisk.DeleteOption == "Delete" {
		req.DeleteWith = append(req.DeleteWith, disk.ID)
	}

	in, err := s.cloud.Create(req)
	if err != nil && newDisk {
		_ = s.cloud.DeleteResource(disk.ID)
	}
	switch {
	case err == nil:
		meta.createdAt = s.opts.now()
		meta.extensionFailed = s.opts.failingExtension
		s.mu.Lock()
		s.meta[in.ID] = meta
		s.mu.Unlock()
		var until time.Time
		if s.opts.createDuration > 0 {
			until = meta.createdAt.Add(s.opts.createDuration)
		}
		s.acceptedUntil(w, r, http.StatusCreated, "Microsoft.Compute", s.renderVM(in, &meta, "Creating", false), nil, until)
	case errors.Is(err, cloud.ErrNameConflict) && ifNoneMatch == "*":
		writeError(w, apiError{http.StatusPreconditionFailed, "PreconditionFailed",
			fmt.Sprintf("The virtual machine %s already exists and If-None-Match is '*'.", name), ""})
	case errors.Is(err, cloud.ErrNameConflict) && (in.Image != req.Image || in.InstanceType != req.InstanceType):
		writeError(w, apiError{http.StatusConflict, "PropertyChangeNotAllowed",
			"Changing property 'imageReference' or 'vmSize' of an existing virtual machine is not allowed.", ""})
	case errors.Is(err, cloud.ErrNameConflict):
		m := s.metaOf(in.ID)
		writeJSON(w, http.StatusOK, s.renderVM(in, m, "Succeeded", false))
	case errors.Is(err, cloud.ErrCapacity):
		// Azure accepts the PUT and fails the operation once allocation is
		// tried; the core kept nothing, so the VM is gone afterwards.
		ghost := cloud.Instance{Name: name, Tags: req.Tags, InstanceType: req.InstanceType, Image: req.Image}
		fail := coreError(err, req.Image, req.InstanceType, meta.location)
		// Its NICs stay reserved for the VM that failed a while: a NIC
		// delete meanwhile is refused (fidelity.go).
		var nicIDs []string
		for _, ref := range meta.nics {
			nicIDs = append(nicIDs, ref.ID)
		}
		s.reserveNIC(nicIDs, name)
		s.accepted(w, r, http.StatusCreated, "Microsoft.Compute", s.renderVM(ghost, &meta, "Creating", false), &fail)
	default:
		writeError(w, coreError(err, req.Image, req.InstanceType, meta.location))
	}
}

// parseVM checks a VM body as the compute resource provider does and turns
// it into a core request and the metadata to show later.
func (s *server) parseVM(name string, body vmWire) (cloud.CreateRequest, vmMeta, *apiError) {
	var req cloud.CreateRequest
	p := body.Properties
	if body.Name != "" && !strings.EqualFold(body.Name, name) {
		return req, vmMeta{}, invalidParameter("name", "The name in the body does not match the name in the URL.")
	}
	if e := s.checkLocation(body.Location, vmType); e != nil {
		return req, vmMeta{}, e
	}
	for _, z := range body.Zones {
		if z != "1" && z != "2" && z != "3" {
			return req, vmMeta{}, invalidParameter("zones", "The zone(s) '%s' for resource '%s' is not supported. The supported zones for location '%s' are '1,2,3'.", z, name, s.opts.location)
		}
	}
	if e := checkTags(body.Tags); e != nil {
		return req, vmMeta{}, e
	}
	switch {
	case p == nil:
		return req, vmMeta{}, invalidParameter("properties", "Required parameter 'properties' is missing (null).")
	case p.HardwareProfile == nil || p.HardwareProfile.VMSize == "":
		return req, vmMeta{}, invalidParameter("hardwareProfile.vmSize", "Required parameter 'vmSize' is missing (null).")
	case p.StorageProfile == nil || p.StorageProfile.ImageReference == nil:
		return req, vmMeta{}, invalidParameter("storageProfile.imageReference", "Required parameter 'imageReference' is missing (null).")
	case p.OSProfile == nil:
		return req, vmMeta{}, invalidParameter("osProfile", "Required parameter 'osProfile' is missing (null).")
	case p.NetworkProfile == nil || len(p.NetworkProfile.NetworkInterfaces) == 0:
		return req, vmMeta{}, invalidParameter("networkProfile", "At least one network interface is required.")
	}
	if n, complete := p.StorageProfile.ImageReference.forms(); n != 1 || (p.StorageProfile.ImageReference.ID == "" &&
		p.StorageProfile.ImageReference.SharedGalleryImageID == "" && p.StorageProfile.ImageReference.CommunityGalleryImageID == "" && !complete) {
		return req, vmMeta{}, invalidParameter("imageReference", "Set exactly one of id, sharedGalleryImageId, communityGalleryImageId, or publisher, offer, sku and version together.")
	}
	disk, e := s.parseOSDisk(name, p.StorageProfile.OSDisk)
	if e != nil {
		return req, vmMeta{}, e
	}
	tee, e := s.parseSecurity(p, disk)
	if e != nil {
		return req, vmMeta{}, e
	}
	req.TEE = tee
	customData, shown, e := parseOSProfile(p.OSProfile)
	if e != nil {
		return req, vmMeta{}, e
	}
	userData, e := parseUserData(p.UserData)
	if e != nil {
		return req, vmMeta{}, e
	}
	meta := vmMeta{location: s.opts.location, zones: slices.Clone(body.Zones), os: shown, osDisk: disk, customData: customData,
		secureBoot: secureBootOf(p)}
	for i, ref := range p.NetworkProfile.NetworkInterfaces {
		id, ok := parseResourceID(ref.ID)
		if !ok || !id.is(nicType) || !strings.EqualFold(id.sub, s.opts.subscription) {
			return req, vmMeta{}, &apiError{http.StatusBadRequest, "InvalidResourceReference",
				fmt.Sprintf("Network interface reference %d is not the id of a network interface in this subscription.", i), "networkProfile.networkInterfaces"}
		}
		deleteOption := ""
		if ref.Properties != nil {
			deleteOption = ref.Properties.DeleteOption
		}
		if deleteOption != "" && deleteOption != "Delete" && deleteOption != "Detach" {
			return req, vmMeta{}, invalidParameter("networkProfile.networkInterfaces.deleteOption", "The deleteOption must be Delete or Detach.")
		}
		req.Resources = append(req.Resources, key(ref.ID))
		if deleteOption == "Delete" {
			req.DeleteWith = append(req.DeleteWith, key(ref.ID))
		}
		meta.nics = append(meta.nics, ref)
	}
	req.Name = name
	req.UniqueName = true
	req.Tags = body.Tags
	req.InstanceType = p.HardwareProfile.VMSize
	req.Image = p.StorageProfile.ImageReference.String()
	req.UserData = userData
	req.Unreachable = s.bootFails(meta.secureBoot, req.Image)
	return req, meta, nil
}

func (s *server) parseOSDisk(vm string, d *osDisk) (*osDisk, *apiError) {
	out := osDisk{Name: vm + "_OsDisk_1", CreateOption: "FromImage", OSType: "Linux", Caching: "ReadWrite"}
	if d != nil {
		if !strings.EqualFold(d.CreateOption, "FromImage") {
			return nil, invalidParameter("osDisk.createOption", "Only createOption FromImage is supported for a VM made from an image.")
		}
		if d.DeleteOption != "" && d.DeleteOption != "Delete" && d.DeleteOption != "Detach" {
			return nil, invalidParameter("osDisk.deleteOption", "The deleteOption must be Delete or Detach.")
		}
		if d.Name != "" {
			if e := checkName(d.Name, "disk", nicNameRE); e != nil {
				return nil, e
			}
			out.Name = d.Name
		}
		out.DeleteOption = d.DeleteOption
		out.DiskSizeGB = d.DiskSizeGB
		out.ManagedDisk = d.ManagedDisk
	}
	if out.DeleteOption == "" {
		out.DeleteOption = "Detach"
	}
	md := managedDisk{StorageAccountType: "Standard_LRS"}
	if out.ManagedDisk != nil && out.ManagedDisk.StorageAccountType != "" {
		md.StorageAccountType = out.ManagedDisk.StorageAccountType
	}
	if out.ManagedDisk != nil {
		md.SecurityProfile = out.ManagedDisk.SecurityProfile
	}
	md.ID = s.armID(diskType, out.Name)
	out.ManagedDisk = &md
	return &out, nil
}

// MaxUserData is Azure's cap on properties.userData: 64 KB of base64 text
// (learn.microsoft.com/azure/virtual-machines/user-data).
const MaxUserData = 64 << 10

// parseUserData decodes properties.userData, the VM's user data that its
// instance metadata service serves (compute/userData).
func parseUserData(b64 string) ([]byte, *apiError) {
	if b64 == "" {
		return nil, nil
	}
	if len(b64) > MaxUserData {
		return nil, invalidParameter("userData", "The value of parameter userData is too long: its base64 text is %d characters, at most %d are allowed.", len(b64), MaxUserData)
	}
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, invalidParameter("userData", "The value of parameter userData is invalid: it must be base64.")
	}
	return data, nil
}

// parseOSProfile checks the Linux provisioning settings and decodes the
// custom data; what it returns for display holds no secret.
func parseOSProfile(o *osProfile) ([]byte, *osProfile, *apiError) {
	if !hostnameRE.MatchString(o.ComputerName) {
		return nil, nil, invalidParameter("osProfile.computerName", "The computer name must be 1 to 64 letters, digits and hyphens, and not start or end with a hyphen.")
	}
	if o.AdminUsername == "" || o.AdminUsername == "root" || o.AdminUsername == "admin" {
		return nil, nil, invalidParameter("adminUsername", "The admin username is required and must not be a reserved name.")
	}
	lc := o.LinuxConfiguration
	passwordOff := lc != nil && lc.DisablePasswordAuthentication != nil && *lc.DisablePasswordAuthentication
	var keys int
	if lc != nil && lc.SSH != nil {
		want := "/home/" + o.AdminUsername + "/.ssh/authorized_keys"
		for _, k := range lc.SSH.PublicKeys {
			if k.Path != want {
				return nil, nil, invalidParameter("linuxConfiguration.ssh.publicKeys.path",
					"Destination path for SSH public keys is currently limited to its default value %s.", want)
			}
			if !strings.HasPrefix(k.KeyData, "ssh-") && !strings.HasPrefix(k.KeyData, "ecdsa-") {
				return nil, nil, invalidParameter("linuxConfiguration.ssh.publicKeys.keyData", "The value of parameter keyData is not an SSH public key.")
			}
			keys++
		}
	}
	switch {
	case passwordOff && keys == 0:
		return nil, nil, invalidParameter("linuxConfiguration.ssh.publicKeys", "Authentication using either SSH or by user name and password must be enabled in Linux profile.")
	case !passwordOff && o.AdminPassword == "":
		return nil, nil, invalidParameter("adminPassword", "Required parameter 'adminPassword' is missing (null).")
	}
	var customData []byte
	if o.CustomData != "" {
		var err error
		if customData, err = base64.StdEncoding.DecodeString(o.CustomData); err != nil {
			return nil, nil, invalidParameter("customData", "The value of parameter customData is invalid: it must be base64.")
		}
		if len(customData) > 65535 {
			return nil, nil, invalidParameter("customData", "Custom data in OSProfile must be at most 65535 bytes.")
		}
	}
	shown := *o
	shown.CustomData, shown.AdminPassword = "", ""
	return customData, &shown, nil
}

func (s *server) checkLocation(loc, typ string) *apiError {
	norm := func(v string) string { return strings.ToLower(strings.ReplaceAll(v, " ", "")) }
	if loc == "" {
		return invalidParameter("location", "Required parameter 'location' is missing (null).")
	}
	if norm(loc) != norm(s.opts.location) {
		return &apiError{http.StatusBadRequest, "LocationNotAvailableForResourceType",
			fmt.Sprintf("The provided location '%s' is not available for resource type '%s'. List of available regions for the resource type is '%s'.", loc, typ, s.opts.location), ""}
	}
	return nil
}

// checkTags applies ARM's tag limits.
func checkTags(tags map[string]string) *apiError {
	if len(tags) > 50 {
		return invalidParameter("tags", "A resource can have at most 50 tags; the request has %d.", len(tags))
	}
	for k, v := range tags {
		if k == "" || len(k) > 512 || strings.ContainsAny(k, `<>%&\?/`) {
			return invalidParameter("tags", "The tag name '%s' is empty, longer than 512 characters, or has one of <>%%&\\?/.", k)
		}
		if len(v) > 256 {
			return invalidParameter("tags", "The value of tag '%s' is longer than 256 characters.", k)
		}
	}
	return nil
}

func (s *server) getVM(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	expand := r.URL.Query().Get("$expand")
	if expand != "" && expand != "instanceView" && expand != "userData" {
		writeError(w, *invalidParameter("$expand", "The value '%s' of $expand is not supported: use instanceView or userData.", expand))
		return
	}
	in, ok := s.lookup(name)
	if !ok {
		writeError(w, notFound(vmType, name, s.opts.resourceGroup))
		return
	}
	vm := s.renderVM(in, s.metaOf(in.ID), "", expand == "instanceView")
	if ud := in.UserData(); expand == "userData" && len(ud) > 0 {
		vm.Properties.UserData = base64.StdEncoding.EncodeToString(ud)
	}
	writeJSON(w, http.StatusOK, vm)
}

func (s *server) deleteVM(w http.ResponseWriter, r *http.Request) {
	if f := r.URL.Query().Get("forceDeletion"); f != "" && f != "true" && f != "false" {
		writeError(w, *invalidParameter("forceDeletion", "forceDeletion must be true or false."))
		return
	}
	s.writes.Lock()
	defer s.writes.Unlock()
	in, ok := s.lookup(r.PathValue("name"))
	if !ok || in.State == provider.StateTerminated {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// A disk that goes with its VM (deleteOption Delete) is deleted on the
	// caller's behalf: the delete on it is checked (see putVM).
	if m := s.metaOf(in.ID); m != nil && m.osDisk != nil && m.osDisk.DeleteOption == "Delete" && m.osDisk.ManagedDisk != nil {
		if e := s.authorizeLinked("Microsoft.Compute/virtualMachines/delete", r.URL.Path,
			"Microsoft.Compute/disks/delete", m.osDisk.ManagedDisk.ID); e != nil {
			writeError(w, *e)
			return
		}
	}
	if err := s.cloud.Delete(in.ID); err != nil {
		if errors.Is(err, cloud.ErrNotFound) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeError(w, coreError(err, "", "", ""))
		return
	}
	s.mu.Lock()
	delete(s.meta, in.ID)
	s.mu.Unlock()
	s.accepted(w, r, http.StatusAccepted, "Microsoft.Compute", nil, nil)
}

// listVMs lists the resource group's VMs, one core page per ARM page. Like
// ARM, it has no tag filter. $expand=instanceView adds each VM's instance
// view (its power state), unless the fake was made to refuse it.
func (s *server) listVMs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("$filter") != "" {
		writeError(w, *invalidParameter("$filter", "This fake supports no $filter on a resource group list."))
		return
	}
	expand := q.Get("$expand")
	switch {
	case expand != "" && expand != "instanceView":
		writeError(w, *invalidParameter("$expand", "The value '%s' of $expand is not supported on a list: use instanceView.", expand))
		return
	case expand != "" && s.opts.noListView:
		writeError(w, *invalidParameter("$expand", "The $expand=instanceView option can only be specified with a valid $filter option."))
		return
	}
	page, next, err := s.cloud.List(nil, q.Get("$skiptoken"), 0)
	if err != nil {
		writeError(w, *invalidParameter("$skiptoken", "The $skiptoken is not one this list handed out."))
		return
	}
	out := vmList{Value: []vmWire{}}
	for _, in := range page {
		out.Value = append(out.Value, s.renderVM(in, s.metaOf(in.ID), "", expand != ""))
	}
	if next != "" {
		out.NextLink = nextLink(r, next, "$expand")
	}
	writeJSON(w, http.StatusOK, out)
}

// nextLink is the request's own URL with the continuation token set,
// keeping the api-version and the named query options the request had.
func nextLink(r *http.Request, token string, keep ...string) string {
	q := url.Values{"api-version": {r.URL.Query().Get("api-version")}, "$skiptoken": {token}}
	for _, k := range keep {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	return baseURL(r) + r.URL.Path + "?" + q.Encode()
}

// lookup finds the visible VM of that name (ARM names are case
// insensitive), preferring a live one over a terminated one kept visible.
func (s *server) lookup(name string) (cloud.Instance, bool) {
	var found []cloud.Instance
	token := ""
	for {
		page, next, err := s.cloud.List(func(in cloud.Instance) bool { return strings.EqualFold(in.Name, name) }, token, 0)
		if err != nil {
			return cloud.Instance{}, false
		}
		found = append(found, page...)
		if next == "" {
			break
		}
		token = next
	}
	if len(found) == 0 {
		return cloud.Instance{}, false
	}
	for _, in := range slices.Backward(found) {
		if in.State != provider.StateTerminated {
			return in, true
		}
	}
	return found[len(found)-1], true
}

func (s *server) metaOf(id string) *vmMeta {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.meta[id]; ok {
		return &m
	}
	return nil
}

// failedCode is the error code a failed VM's provisioning status carries.
const failedCode = "InternalOperationError"

// armStates shows a core instance's state as ARM does: a provisioning
// state and a power state. Provisioning completes at once in this fake;
// booting shows in the power state. A failed VM has no power state here.
func armStates(in cloud.Instance) (provisioning, power string) {
	switch in.State {
	case provider.StatePending:
		return "Succeeded", "starting"
	case provider.StateRunning:
		return "Succeeded", "running"
	case provider.StateStopping:
		return "Succeeded", "stopping"
	case provider.StateStopped:
		if in.Deallocated {
			return "Succeeded", "deallocated"
		}
		return "Succeeded", "stopped"
	case provider.StateTerminated:
		return "Deleting", "deallocating"
	case provider.StateFailed:
		// A VM the core failed is one that is not running either (e.g. its
		// start failed for allocation: Azure leaves it Failed and
		// deallocated). A Failed VM that runs is an extension failure
		// (vmMeta.extensionFailed), which the core does not model.
		return "Failed", "deallocated"
	}
	return "Succeeded", "unknown"
}

// renderVM shows an instance as ARM does; provisioning overrides the
// state-derived provisioning state when set.
func (s *server) renderVM(in cloud.Instance, m *vmMeta, provisioning string, withView bool) vmWire {
	prov, power := armStates(in)
	code := failedCode
	switch {
	case provisioning != "":
		prov = provisioning
	case m != nil && s.creating(m.createdAt) && in.State != provider.StateTerminated:
		prov = "Creating"
	case extensionFailed(in, m):
		prov, code = "Failed", ExtensionFailedCode
	}
	vm := vmWire{
		ID: s.computeID(in.Name), Name: in.Name, Type: vmType, Location: s.opts.location, Tags: in.Tags,
		Properties: &vmProperties{
			HardwareProfile:   &hardwareProfile{VMSize: s.echoSize(in.InstanceType)},
			StorageProfile:    &storageProfile{ImageReference: imageRefOf(in.Image)},
			ProvisioningState: prov,
			VMID:              in.ID,
			SecurityProfile:   securityOf(in.TEE, m),
		},
	}
	if created := in.CreatedAt; !created.IsZero() {
		vm.Properties.TimeCreated = &created
	}
	if m != nil {
		vm.Location, vm.Zones = m.location, m.zones
		vm.Properties.StorageProfile.OSDisk = m.osDisk
		vm.Properties.OSProfile = m.os
		vm.Properties.NetworkProfile = &networkProfile{NetworkInterfaces: m.nics}
	}
	if withView {
		status := instanceStatus{Code: "ProvisioningState/" + strings.ToLower(prov), Level: "Info", DisplayStatus: "Provisioning " + strings.ToLower(prov)}
		if prov == "Failed" {
			status = instanceStatus{Code: "ProvisioningState/failed/" + code, Level: "Error", DisplayStatus: "Provisioning failed"}
		}
		view := &instanceView{Statuses: []instanceStatus{status}}
		if power != "" {
			view.Statuses = append(view.Statuses, instanceStatus{Code: "PowerState/" + power, Level: "Info", DisplayStatus: "VM " + power})
		}
		if m != nil {
			view.ComputerName = m.os.ComputerName
		}
		vm.Properties.InstanceView = view
	}
	return vm
}
