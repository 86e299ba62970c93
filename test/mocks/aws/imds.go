package ec2fake

import (
	"crypto/rand"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// The instance metadata service's paths the pod VM image uses (IMDSv2).
const (
	IMDSTokenPath    = "/latest/api/token"
	IMDSUserDataPath = "/latest/user-data"
	imdsMetaPrefix   = "/latest/meta-data/"
)

// IMDS is the instance metadata service as instance instanceID of c sees
// it at 169.254.169.254, with HttpTokens=required (IMDSv2 only, as caa
// launches its VMs): PUT /latest/api/token with a TTL of 1 to 21600 seconds
// in X-aws-ec2-metadata-token-ttl-seconds answers a token; GET
// /latest/user-data with a live token in X-aws-ec2-metadata-token answers
// the user data as launched (decoded, raw bytes), 404 when it has none,
// 401 without a valid token. now is the clock (nil: time.Now).
func IMDS(c *cloud.Cloud, instanceID string, now func() time.Time) http.Handler {
	return imdsV2(now, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != IMDSUserDataPath {
			http.Error(w, "", http.StatusNotFound)
			return
		}
		in, err := c.Get(instanceID)
		if err != nil || len(in.UserData()) == 0 {
			http.Error(w, "", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(in.UserData())
	})
}

// Node is what a worker node's instance metadata says of it: the region,
// and its primary interface's MAC, subnet and security groups.
type Node struct {
	Region string
	MAC    string
	Subnet string
	Groups []string
}

// NodeIMDS is the instance metadata service as a worker node sees it, for
// the settings caa (like upstream's adaptor) reads from it when they are
// not given: meta-data/mac, meta-data/placement/region and, under
// meta-data/network/interfaces/macs/<mac>/, subnet-id and
// security-group-ids (one id a line). IMDSv2 tokens as IMDS.
func NodeIMDS(n Node, now func() time.Time) http.Handler {
	iface := imdsMetaPrefix + "network/interfaces/macs/" + n.MAC + "/"
	values := map[string]string{
		imdsMetaPrefix + "mac":              n.MAC,
		imdsMetaPrefix + "placement/region": n.Region,
		iface + "subnet-id":                 n.Subnet,
		iface + "security-group-ids":        strings.Join(n.Groups, "\n"),
	}
	return imdsV2(now, func(w http.ResponseWriter, r *http.Request) {
		v, ok := values[r.URL.Path]
		if !ok || v == "" {
			http.Error(w, "", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(v))
	})
}

// imdsV2 serves PUT /latest/api/token and hands every GET that carries a
// live token to get.
func imdsV2(now func() time.Time, get http.HandlerFunc) http.Handler {
	if now == nil {
		now = time.Now
	}
	var mu sync.Mutex
	tokens := map[string]time.Time{} // token -> expiry
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == IMDSTokenPath && r.Method == http.MethodPut:
			ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
			if err != nil || ttl < 1 || ttl > 21600 {
				http.Error(w, "", http.StatusBadRequest)
				return
			}
			tok := rand.Text()
			mu.Lock()
			tokens[tok] = now().Add(time.Duration(ttl) * time.Second)
			mu.Unlock()
			w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
			_, _ = w.Write([]byte(tok))
		case r.URL.Path == IMDSTokenPath:
			http.Error(w, "", http.StatusMethodNotAllowed)
		case r.Method != http.MethodGet:
			http.Error(w, "", http.StatusMethodNotAllowed)
		default:
			mu.Lock()
			exp, ok := tokens[r.Header.Get("X-aws-ec2-metadata-token")]
			mu.Unlock()
			if !ok || !now().Before(exp) {
				http.Error(w, "", http.StatusUnauthorized)
				return
			}
			get(w, r)
		}
	})
}
