package ec2fake

import (
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"

	"github.com/caa-project/caa/test/mocks/cloud"
)

var errMalformedSignature = errors.New("signer produced no parsable Authorization header")

// apiError is one EC2 error reply.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

func missing(param string) *apiError {
	return &apiError{http.StatusBadRequest, "MissingParameter", fmt.Sprintf("The request must contain the parameter %s.", param)}
}

func invalidValue(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf(format, args...)}
}

// coreError turns an error of the core into EC2's code and status. subject
// names what the request was about (an instance id, an image), for the
// message.
func coreError(err error, subject string) *apiError {
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		return &apiError{http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", subject)}
	case errors.Is(err, cloud.ErrQuota):
		return &apiError{http.StatusBadRequest, "VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit allows for the instance bucket that the specified instance type belongs to."}
	case errors.Is(err, cloud.ErrCapacity):
		return &apiError{http.StatusInternalServerError, "InsufficientInstanceCapacity", fmt.Sprintf("We currently do not have sufficient %s capacity in the Availability Zone you requested.", subject)}
	case errors.Is(err, cloud.ErrBadImage):
		return &apiError{http.StatusBadRequest, "InvalidAMIID.NotFound", fmt.Sprintf("The image id '[%s]' does not exist", subject)}
	case errors.Is(err, cloud.ErrBadType):
		return invalidValue("Invalid value '%s' for InstanceType.", subject)
	case errors.Is(err, cloud.ErrIdempotencyMismatch):
		return &apiError{http.StatusBadRequest, "IdempotentParameterMismatch", "The client token you have provided is associated with a resource launched with different parameters."}
	case errors.Is(err, cloud.ErrNameConflict):
		// EC2 has no unique names; the nearest reply is a state clash.
		return &apiError{http.StatusBadRequest, "IncorrectState", "The request conflicts with the current state of the resource."}
	case errors.Is(err, cloud.ErrResourceNotFound):
		return &apiError{http.StatusBadRequest, "InvalidVolume.NotFound", "The volume does not exist."}
	case errors.Is(err, cloud.ErrResourceInUse):
		return &apiError{http.StatusBadRequest, "VolumeInUse", "The volume is attached to an instance."}
	}
	return &apiError{http.StatusInternalServerError, "InternalError", "An internal error has occurred."}
}

// errorDoc is EC2's error body.
type errorDoc struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

func (s *server) writeError(w http.ResponseWriter, e *apiError) {
	s.writeXML(w, e.status, errorDoc{Code: e.code, Message: e.message, RequestID: s.requestID()})
}

func (s *server) writeXML(w http.ResponseWriter, status int, doc any) {
	out, err := xml.Marshal(doc)
	if err != nil {
		http.Error(w, "marshal response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(out)
}
