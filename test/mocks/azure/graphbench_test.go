package armfake_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caa-project/caa/pkg/provider"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// BenchmarkGraphQueryAmongOthers is one node's Resource Graph listing (30
// VMs) in a group that also holds 20,000 VMs of 100 other nodes, each query
// after a change to the core, so that no answer is served again: what one
// start costs the fake in S6's largest startup case.
//
//	go test -run '^$' -bench GraphQueryAmongOthers ./test/mocks/azure
func BenchmarkGraphQueryAmongOthers(b *testing.B) {
	c := cloud.New(cloud.Options{PageSize: 1000, Images: []string{image}, Types: []string{size}})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token)))
	b.Cleanup(srv.Close)
	for i := range 20030 {
		node := fmt.Sprintf("other-%03d", i%100)
		if i >= 20000 {
			node = "n1"
		}
		_, err := c.Create(cloud.CreateRequest{Name: fmt.Sprintf("vm-%05d", i), Image: image, InstanceType: size,
			Tags: map[string]string{provider.TagManagedBy: provider.ManagedByValue, provider.TagCluster: "c1", provider.TagNode: node}})
		if err != nil {
			b.Fatal(err)
		}
	}
	body, err := json.Marshal(query(vmsOfNode, nil))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		c.SetFaults(cloud.Faults{})
		req, err := http.NewRequest(http.MethodPost, srv.URL+graphURL, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var out struct{ Count int }
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || out.Count != 30 {
			b.Fatalf("%d: %.200s", resp.StatusCode, raw)
		}
	}
}
