package armfake

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Props under which the core holds a NIC's settings.
const (
	propLocation   = "location"
	propIPConfig   = "ipConfiguration"
	propSubnet     = "subnet"
	propAllocation = "allocation"
	propStaticIP   = "staticIP"
	propNSG        = "networkSecurityGroup"
)

// putNIC creates or replaces a NIC; its attachment survives a replace, as
// the core keeps a resource's owner.
func (s *server) putNIC(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if e := checkName(name, "network interface", nicNameRE); e != nil {
		writeError(w, *e)
		return
	}
	var body nicWire
	if e := decodeStrict(r, &body); e != nil {
		writeError(w, *e)
		return
	}
	res, e := s.parseNIC(name, body)
	if e != nil {
		writeError(w, *e)
		return
	}
	if e := s.linkedNIC(r, res); e != nil {
		writeError(w, *e)
		return
	}
	s.writes.Lock()
	defer s.writes.Unlock()
	status := http.StatusOK
	if _, err := s.cloud.GetResource(res.ID); errors.Is(err, cloud.ErrResourceNotFound) {
		status = http.StatusCreated
	}
	res = s.cloud.PutResource(res)
	s.accepted(w, r, status, "Microsoft.Network", s.renderNIC(res), nil)
}

func (s *server) parseNIC(name string, body nicWire) (cloud.Resource, *apiError) {
	if body.Name != "" && !strings.EqualFold(body.Name, name) {
		return cloud.Resource{}, invalidParameter("name", "The name in the body does not match the name in the URL.")
	}
	if e := s.checkLocation(body.Location, nicType); e != nil {
		return cloud.Resource{}, e
	}
	if e := checkTags(body.Tags); e != nil {
		return cloud.Resource{}, e
	}
	p := body.Properties
	if p == nil || len(p.IPConfigurations) != 1 {
		return cloud.Resource{}, &apiError{http.StatusBadRequest, "InvalidRequestFormat",
			"This fake supports exactly one IP configuration per network interface.", "properties.ipConfigurations"}
	}
	ipc := p.IPConfigurations[0]
	if ipc.Name == "" || ipc.Properties == nil || ipc.Properties.Subnet == nil {
		return cloud.Resource{}, &apiError{http.StatusBadRequest, "InvalidRequestFormat",
			"An IP configuration needs a name and a subnet.", "properties.ipConfigurations"}
	}
	if id, ok := parseResourceID(ipc.Properties.Subnet.ID); !ok || !id.is("Microsoft.Network/virtualNetworks/subnets") {
		return cloud.Resource{}, &apiError{http.StatusBadRequest, "InvalidResourceReference",
			"The subnet reference is not the id of a subnet.", "properties.ipConfigurations.subnet"}
	}
	alloc := ipc.Properties.PrivateIPAllocationMethod
	switch {
	case alloc == "":
		alloc = "Dynamic"
	case alloc == "Static" && ipc.Properties.PrivateIPAddress == "":
		return cloud.Resource{}, invalidParameter("privateIPAddress", "A Static allocation needs a privateIPAddress.")
	case alloc != "Dynamic" && alloc != "Static":
		return cloud.Resource{}, invalidParameter("privateIPAllocationMethod", "The allocation method must be Dynamic or Static.")
	}
	props := map[string]string{
		propLocation: s.opts.location, propIPConfig: ipc.Name, propSubnet: ipc.Properties.Subnet.ID,
		propAllocation: alloc, propStaticIP: ipc.Properties.PrivateIPAddress,
	}
	if p.NetworkSecurityGroup != nil {
		if id, ok := parseResourceID(p.NetworkSecurityGroup.ID); !ok || !id.is("Microsoft.Network/networkSecurityGroups") {
			return cloud.Resource{}, &apiError{http.StatusBadRequest, "InvalidResourceReference",
				"The networkSecurityGroup reference is not the id of a network security group.", "properties.networkSecurityGroup"}
		}
		props[propNSG] = p.NetworkSecurityGroup.ID
	}
	return cloud.Resource{ID: key(s.armID(nicType, name)), Kind: nicType, Name: name, Tags: body.Tags, Props: props}, nil
}

func (s *server) getNIC(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	res, err := s.cloud.GetResource(key(s.armID(nicType, name)))
	if err != nil {
		writeError(w, notFound(nicType, name, s.opts.resourceGroup))
		return
	}
	writeJSON(w, http.StatusOK, s.renderNIC(res))
}

// deleteNIC deletes a NIC that no live VM uses: 202 with an operation, 204
// when there was none, NicInUse while a VM holds it.
func (s *server) deleteNIC(w http.ResponseWriter, r *http.Request) {
	s.writes.Lock()
	defer s.writes.Unlock()
	if e := s.nicReserved(s.armID(nicType, r.PathValue("name"))); e != nil {
		writeError(w, *e)
		return
	}
	err := s.cloud.DeleteResource(key(s.armID(nicType, r.PathValue("name"))))
	switch {
	case err == nil:
		s.accepted(w, r, http.StatusAccepted, "Microsoft.Network", nil, nil)
	case errors.Is(err, cloud.ErrResourceNotFound):
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, coreError(err, "", "", ""))
	}
}

// listNICs pages through the resource group's NICs in id order; the
// continuation token is the last id of the page.
func (s *server) listNICs(w http.ResponseWriter, r *http.Request) {
	after, last := r.URL.Query().Get("$skiptoken"), ""
	out := nicList{Value: []nicWire{}}
	for _, res := range s.cloud.Resources(nicType) {
		if res.ID <= after {
			continue
		}
		if len(out.Value) == s.cloud.PageSize() {
			out.NextLink = nextLink(r, last)
			break
		}
		out.Value = append(out.Value, s.renderNIC(res))
		last = res.ID
	}
	writeJSON(w, http.StatusOK, out)
}

// renderNIC shows a NIC as ARM does. An attached NIC reports its VM and the
// core instance's address as its private IP; a detached one has none yet.
func (s *server) renderNIC(res cloud.Resource) nicWire {
	id := s.armID(nicType, res.Name)
	ipc := ipConfiguration{
		ID:   id + "/ipConfigurations/" + res.Props[propIPConfig],
		Name: res.Props[propIPConfig],
		Properties: &ipConfigurationProperties{
			Subnet:                    &subResource{ID: res.Props[propSubnet]},
			PrivateIPAllocationMethod: res.Props[propAllocation],
			PrivateIPAddress:          res.Props[propStaticIP],
			PrivateIPAddressVersion:   "IPv4",
			Primary:                   new(true),
			ProvisioningState:         "Succeeded",
		},
	}
	nic := nicWire{
		ID: id, Name: res.Name, Type: nicType, Location: res.Props[propLocation], Tags: res.Tags,
		Properties: &nicProperties{IPConfigurations: []ipConfiguration{ipc}, ProvisioningState: "Succeeded"},
	}
	if nsg := res.Props[propNSG]; nsg != "" {
		nic.Properties.NetworkSecurityGroup = &subResource{ID: nsg}
	}
	if res.Owner != "" {
		if in, err := s.cloud.Get(res.Owner); err == nil {
			nic.Properties.VirtualMachine = &subResource{ID: s.armID(vmType, in.Name)}
			nic.Properties.Primary = new(true)
			if ipc.Properties.PrivateIPAddress == "" && len(in.IPs) > 0 {
				ipc.Properties.PrivateIPAddress = in.IPs[0]
			}
		}
	}
	return nic
}

// linkedNIC checks what a NIC write references: the join action on its
// subnet and security group, and that the subnet exists.
func (s *server) linkedNIC(r *http.Request, res cloud.Resource) *apiError {
	const write = "Microsoft.Network/networkInterfaces/write"
	subnet := res.Props[propSubnet]
	if e := s.authorizeLinked(write, r.URL.Path, "Microsoft.Network/virtualNetworks/subnets/join/action", subnet); e != nil {
		return e
	}
	if nsg := res.Props[propNSG]; nsg != "" {
		if e := s.authorizeLinked(write, r.URL.Path, "Microsoft.Network/networkSecurityGroups/join/action", nsg); e != nil {
			return e
		}
	}
	if !s.subnetExists(subnet) {
		return &apiError{http.StatusBadRequest, "InvalidResourceReference",
			fmt.Sprintf("Resource %s referenced by resource %s was not found. Please make sure that the referenced resource exists, and that both resources are in the same region.",
				subnet, r.URL.Path), ""}
	}
	return nil
}
