package armfake

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// This file holds the fake's behaviours that make it answer as the real
// Azure does where a simpler fake would agree with caa and the cloud would
// not. Each names its source.

// ExtensionFailedCode is the code of the provisioning status of a VM whose
// extension failed (WithFailingPolicyExtension, FailExtension).
const ExtensionFailedCode = "VMExtensionProvisioningError"

// WithFailingPolicyExtension makes every new VM's extension fail, as an
// extension that Azure Policy (DeployIfNotExists) or Defender pushes onto
// every VM of a scope does when it cannot install: the VM's create
// succeeds and it boots and runs, and then its provisioning state turns
// Failed (ProvisioningState/failed/VMExtensionProvisioningError) while its
// power state stays running. The provisioning state is the outcome of the
// last control-plane operation, not the VM's health: Azure's "VM
// provisioning states" page, and its support article on VMs whose
// extensions are stuck in Failed ("the guest OS is active and working").
// A replacement VM gets the same extension and fails the same way.
func WithFailingPolicyExtension() Option { return func(o *options) { o.failingExtension = true } }

// WithEchoedCase makes the fake echo what Azure echoes in another case than
// it was sent: the compute API's VM ids carry the resource group in upper
// case (azure-sdk-for-python issue 574, azure-powershell issue 13516,
// MicrosoftDocs/azure-docs issue 36222, azure-cli issue 8283: compute and
// network ids of one group differ in case), while Resource Graph and the
// network API keep the group as created; and a VM size comes back with its
// version suffix in another case ("Standard_DS2_V2" for "Standard_DS2_v2",
// azure-cli issue 9238). ARM ids and sizes are case-insensitive (Azure's
// "Naming rules and restrictions": resource names are case-insensitive
// unless noted), so a client must compare them so.
func WithEchoedCase() Option { return func(o *options) { o.echoCase = true } }

// computeID is a VM's id as the compute API echoes it.
func (s *server) computeID(name string) string {
	id := s.armID(vmType, name)
	if !s.opts.echoCase {
		return id
	}
	return strings.Replace(id, "/resourceGroups/"+s.opts.resourceGroup+"/", "/resourceGroups/"+strings.ToUpper(s.opts.resourceGroup)+"/", 1)
}

var sizeVersionRE = regexp.MustCompile(`_v(\d+)$`)

// echoSize is a VM size as the compute API echoes it.
func (s *server) echoSize(size string) string {
	if !s.opts.echoCase {
		return size
	}
	return sizeVersionRE.ReplaceAllString(size, "_V$1")
}

// FailExtension makes the VM of that core id show an extension failure from
// now on: provisioning Failed with ExtensionFailedCode, the power state
// untouched (see WithFailingPolicyExtension).
func (s *server) FailExtension(id string) error {
	if _, err := s.cloud.Get(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.meta[id]
	if m.location == "" {
		m.location = s.opts.location
	}
	m.extensionFailed = true
	s.meta[id] = m
	s.gen.Add(1)
	return nil
}

// ControlFailExtension is the control route (POST, ?id=<core id>) that
// calls FailExtension.
const ControlFailExtension = cloud.ControlPrefix + "azure/fail-extension"

func (s *server) controlFailExtension(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if err := s.FailExtension(id); err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id})
}

// extensionFailed reports whether a VM's extension failed while the VM is
// alive: a stopped or gone VM shows its own state.
func extensionFailed(in cloud.Instance, m *vmMeta) bool {
	return m != nil && m.extensionFailed && (in.State == provider.StatePending || in.State == provider.StateRunning)
}

// DefaultNICReservation is how long Azure keeps a NIC reserved for the VM
// whose create failed or that was deleted: "Nic(s) in request is reserved
// for another Virtual Machine for 180 seconds" (the NicReservedForAnotherVm
// error, as reported in Azure/karpenter-provider-azure issue 92,
// cloudfoundry/bosh-azure-cpi-release issue 366 and
// gardenlinux/gardenlinux issue 4133).
const DefaultNICReservation = 180 * time.Second

// WithNICReservation sets how long a NIC stays reserved after a VM create
// that referenced it failed (default DefaultNICReservation; tests scale it
// down). During it, a NIC delete is refused with 400
// NicReservedForAnotherVm, naming the VM. Times are on the fake's clock
// (WithClock).
func WithNICReservation(d time.Duration) Option { return func(o *options) { o.nicReservation = d } }

// reserveNIC reserves the NICs of a failed VM create for vm.
func (s *server) reserveNIC(nicIDs []string, vm string) {
	d := s.opts.nicReservation
	if d <= 0 {
		d = DefaultNICReservation
	}
	until := s.opts.now().Add(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved == nil {
		s.reserved = map[string]reservation{}
	}
	for _, id := range nicIDs {
		s.reserved[key(id)] = reservation{vm: s.armID(vmType, vm), until: until}
	}
}

// reservation is a NIC held for a VM until a time.
type reservation struct {
	vm    string
	until time.Time
}

// nicReserved is the refusal of a delete of a NIC still reserved, if it is.
func (s *server) nicReserved(nicID string) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reserved[key(nicID)]
	if !ok {
		return nil
	}
	if !s.opts.now().Before(r.until) {
		delete(s.reserved, key(nicID))
		return nil
	}
	return &apiError{http.StatusBadRequest, "NicReservedForAnotherVm", fmt.Sprintf(
		"Nic(s) in request is reserved for another Virtual Machine for %d seconds. Please provide another nic(s) or retry after %d seconds. Reserved VM: %s",
		int(s.reservationLength().Seconds()), int(s.reservationLength().Seconds()), r.vm), ""}
}

func (s *server) reservationLength() time.Duration {
	if s.opts.nicReservation > 0 {
		return s.opts.nicReservation
	}
	return DefaultNICReservation
}

// WithCreateDuration makes a VM's create take d on the fake's clock before
// its operation succeeds: the VM exists from the PUT on, with provisioning
// state Creating, and its operation reports InProgress (asking the client
// to poll again in a second, as ARM's Retry-After does) until d has passed.
// A real Linux VM create with OS provisioning takes one to several minutes
// (Azure's "Create a Linux VM" quickstarts; confidential VMs longer), past a
// two-minute client timeout; tests scale it down.
func WithCreateDuration(d time.Duration) Option { return func(o *options) { o.createDuration = d } }

// creating reports whether a VM created at created is still being created.
func (s *server) creating(created time.Time) bool {
	return s.opts.createDuration > 0 && !created.IsZero() && s.opts.now().Before(created.Add(s.opts.createDuration))
}

// CloudTimingCreate is how long a VM create takes in the cloud-timing
// profile (WithCloudTiming): a Linux VM with OS provisioning, in the one to
// several minutes Azure takes, past a two-minute client timeout.
const CloudTimingCreate = 150 * time.Second

// WithCloudTiming is the cloud-timing profile: operations take as long as
// on Azure (creates CloudTimingCreate, NIC reservations
// DefaultNICReservation), for the demo and the fake cloud command; tests
// scale the times down with WithCreateDuration and WithNICReservation.
func WithCloudTiming() Option {
	return func(o *options) { o.createDuration, o.nicReservation = CloudTimingCreate, DefaultNICReservation }
}
