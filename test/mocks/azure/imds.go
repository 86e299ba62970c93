package armfake

import (
	"encoding/base64"
	"net/http"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// IMDSUserDataPath is the instance metadata service's path of a VM's user
// data (properties.userData), which the peer-pods image reads with
// format=text: the base64 text as ARM took it.
const IMDSUserDataPath = "/metadata/instance/compute/userData"

// IMDS is the instance metadata service as VM instanceID of c sees it at
// 169.254.169.254, in the part the pod VM image uses: compute/userData,
// which needs the Metadata: true header and an api-version, and answers
// the VM's properties.userData in base64 (empty when it has none). Custom
// data (osProfile.customData) is never served: Azure's IMDS has no path
// for it, and the fake keeps it apart from the core's user data.
func IMDS(c *cloud.Cloud, instanceID string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Metadata") != "true":
			http.Error(w, `{"error":"Bad request. Required metadata header not specified"}`, http.StatusBadRequest)
			return
		case r.URL.Query().Get("api-version") == "":
			http.Error(w, `{"error":"Bad request. api-version was not specified in the request"}`, http.StatusBadRequest)
			return
		case r.Method != http.MethodGet:
			http.Error(w, `{"error":"Method not allowed"}`, http.StatusMethodNotAllowed)
			return
		case r.URL.Path != IMDSUserDataPath:
			http.Error(w, `{"error":"Not found"}`, http.StatusNotFound)
			return
		}
		in, err := c.Get(instanceID)
		if err != nil {
			http.Error(w, `{"error":"Not found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(base64.StdEncoding.EncodeToString(in.UserData())))
	})
}
