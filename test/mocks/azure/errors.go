package armfake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// apiError is an ARM error response: the status and the body's error object.
type apiError struct {
	status  int
	Code    string `json:"code"`
	Message string `json:"message"`
	Target  string `json:"target,omitempty"`
}

func writeError(w http.ResponseWriter, e apiError) {
	writeJSON(w, e.status, struct {
		Error apiError `json:"error"`
	}{e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONBytes writes JSON already encoded, as writeJSON would.
func writeJSONBytes(w http.ResponseWriter, status int, raw []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(raw)
}

func invalidParameter(target, format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, "InvalidParameter", fmt.Sprintf(format, args...), target}
}

// coreError turns an error of the core into the code and status ARM
// answers with. Messages never quote request bodies.
func coreError(err error, image, size, location string) apiError {
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		return apiError{http.StatusNotFound, "ResourceNotFound", "The virtual machine was not found.", ""}
	case errors.Is(err, cloud.ErrQuota):
		return apiError{http.StatusConflict, "OperationNotAllowed",
			"Operation could not be completed as it results in exceeding approved Total Regional Cores quota. Please read more about quota limits.", ""}
	case errors.Is(err, cloud.ErrCapacity):
		return apiError{http.StatusConflict, "AllocationFailed",
			"Allocation failed. We do not have sufficient capacity for the requested VM size in this region.", ""}
	case errors.Is(err, cloud.ErrBadImage):
		if isPlatformImage(image) {
			return apiError{http.StatusNotFound, "ImageNotFound",
				fmt.Sprintf("The platform image '%s' is not available. Verify that all fields in the storage profile are correct.", image), ""}
		}
		return *invalidParameter("imageReference", "The Image '%s' cannot be found in '%s' region.", image, location)
	case errors.Is(err, cloud.ErrBadType):
		return *invalidParameter("vmSize", "The value %s provided for the VM size is not valid. Use a size the region offers.", size)
	case errors.Is(err, cloud.ErrIdempotencyMismatch):
		return apiError{http.StatusConflict, "PropertyChangeNotAllowed",
			"Changing property 'imageReference' or 'vmSize' of an existing virtual machine is not allowed.", ""}
	case errors.Is(err, cloud.ErrNameConflict):
		return apiError{http.StatusConflict, "Conflict", "A virtual machine with this name already exists.", ""}
	case errors.Is(err, cloud.ErrResourceNotFound):
		return apiError{http.StatusBadRequest, "InvalidResourceReference",
			"A resource referenced by the virtual machine was not found.", "networkProfile"}
	case errors.Is(err, cloud.ErrResourceInUse):
		return apiError{http.StatusBadRequest, "NicInUse",
			"The network interface is used by an existing virtual machine; it must be dissociated first.", ""}
	}
	return apiError{http.StatusInternalServerError, "InternalServerError", "An internal execution error occurred.", ""}
}

// decodeStrict reads a JSON body the way the compute and network resource
// providers do: unknown members are refused. Error messages name fields,
// never values, so user data cannot echo back.
func decodeStrict(r *http.Request, v any) *apiError {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return &apiError{http.StatusBadRequest, "InvalidRequestContent", "The request content could not be read.", ""}
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := "The request content was invalid and could not be deserialized."
		var field string
		if _, after, ok := strings.Cut(err.Error(), "unknown field "); ok {
			field = after
			msg = fmt.Sprintf("Could not find member %s on the request object.", field)
		}
		return &apiError{http.StatusBadRequest, "InvalidRequestContent", msg, strings.Trim(field, `"`)}
	}
	if dec.More() {
		return &apiError{http.StatusBadRequest, "InvalidRequestContent", "The request content has trailing data.", ""}
	}
	return nil
}

// resourceID is a parsed ARM id of a resource in a resource group.
type resourceID struct {
	sub, group string
	typ        string // e.g. Microsoft.Network/virtualNetworks/subnets
	name       string // the last name
}

// parseResourceID splits /subscriptions/S/resourceGroups/G/providers/NS/T1/N1[/T2/N2...].
func parseResourceID(id string) (resourceID, bool) {
	parts := strings.Split(id, "/")
	if len(parts) < 9 || len(parts)%2 == 0 || parts[0] != "" ||
		!strings.EqualFold(parts[1], "subscriptions") || !strings.EqualFold(parts[3], "resourceGroups") ||
		!strings.EqualFold(parts[5], "providers") {
		return resourceID{}, false
	}
	for _, p := range parts[1:] {
		if p == "" {
			return resourceID{}, false
		}
	}
	types := []string{parts[6]}
	for i := 7; i < len(parts); i += 2 {
		types = append(types, parts[i])
	}
	return resourceID{sub: parts[2], group: parts[4], typ: strings.Join(types, "/"), name: parts[len(parts)-1]}, true
}

// is reports whether the id names a resource of type typ.
func (id resourceID) is(typ string) bool { return strings.EqualFold(id.typ, typ) }

func (s *server) armID(typ, name string) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/%s/%s", s.opts.subscription, s.opts.resourceGroup, typ, name)
}

// key is how the core stores a side resource: its ARM id, which is case
// insensitive, in lower case.
func key(armID string) string { return strings.ToLower(armID) }

var (
	vmNameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}[A-Za-z0-9_]$|^[A-Za-z0-9]$`)
	nicNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,78}[A-Za-z0-9_]$|^[A-Za-z0-9]$`)
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?$`)
)

func checkName(name, kind string, re *regexp.Regexp) *apiError {
	if re.MatchString(name) {
		return nil
	}
	return &apiError{http.StatusBadRequest, "InvalidResourceName",
		fmt.Sprintf("Resource name %s is invalid for a %s: use letters, digits, '.', '_' and '-', start with a letter or digit, end with a letter, digit or '_'.", name, kind), ""}
}

func notFound(typ, name, group string) apiError {
	code := "ResourceNotFound"
	if strings.HasPrefix(typ, "Microsoft.Network") {
		code = "NotFound"
	}
	return apiError{http.StatusNotFound, code,
		fmt.Sprintf("The Resource '%s/%s' under resource group '%s' was not found.", typ, name, group), ""}
}
