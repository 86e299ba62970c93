package azure

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resourcegraph/armresourcegraph"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

type benchToken string

func (s benchToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(s), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// pageRecorder keeps the bodies of the Resource Graph answers the fake sends.
type pageRecorder struct {
	mu    sync.Mutex
	pages [][]byte
}

type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(b []byte) (int, error) { w.buf.Write(b); return w.ResponseWriter.Write(b) }

func (r *pageRecorder) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != armfake.GraphPath {
			next.ServeHTTP(w, req)
			return
		}
		tw := &teeWriter{ResponseWriter: w}
		next.ServeHTTP(tw, req)
		r.mu.Lock()
		r.pages = append(r.pages, tw.buf.Bytes())
		r.mu.Unlock()
	})
}

// recordNodeAnswer lists vms VMs of one node from the fake (a row for each
// VM and one for its NIC) and returns the answer's pages as sent.
func recordNodeAnswer(tb testing.TB, vms int) [][]byte {
	tb.Helper()
	c := cloud.New(conformance.Options(&conformance.Clock{}))
	rec := &pageRecorder{}
	const token = "bench-token"
	srv := httptest.NewServer(rec.wrap(armfake.NewServer(c, armfake.WithBearerToken(token))))
	tb.Cleanup(srv.Close)
	p, err := New(context.Background(), Config{
		SubscriptionID: armfake.DefaultSubscription, ResourceGroup: armfake.DefaultResourceGroup, Location: armfake.DefaultLocation,
		SubnetID: "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/" + armfake.DefaultResourceGroup +
			"/providers/Microsoft.Network/virtualNetworks/vnet/subnets/default",
		AdminUsername: "caa", SSHPublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS10ZXN0LWtleQ caa@test",
		Endpoint: srv.URL, PollInterval: time.Millisecond, RetryDelay: time.Millisecond,
	}, WithCredential(benchToken(token)))
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, vms)
	for i := range vms {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := p.Create(ctx, conformance.Spec(i, "node-a")); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
	got, err := p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	if err != nil || len(got) != vms {
		tb.Fatalf("list: %d VMs, %v", len(got), err)
	}
	return rec.pages
}

// BenchmarkDecodeNodeAnswer decodes and reads a recorded answer of 1,000
// VMs and their NICs (2,000 rows, two pages): sdk-any as the generated
// client and readRow read it (the lenient path), typed as List does.
func BenchmarkDecodeNodeAnswer(b *testing.B) {
	pages := recordNodeAnswer(b, 1000)
	b.Run("sdk-any", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			for _, page := range pages {
				var qr armresourcegraph.QueryResponse
				if err := json.Unmarshal(page, &qr); err != nil {
					b.Fatal(err)
				}
				for _, d := range qr.Data.([]any) {
					if _, ok := readRow(d); ok {
						n++
					}
				}
			}
			if n != 2000 {
				b.Fatalf("%d rows", n)
			}
		}
	})
	b.Run("typed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			images := imageRefs{}
			for _, raw := range pages {
				var page graphPage[nodeRow]
				if err := json.Unmarshal(raw, &page); err != nil {
					b.Fatal(err)
				}
				for i := range page.Data {
					if _, ok := page.Data[i].row(images); ok {
						n++
					}
				}
			}
			if n != 2000 {
				b.Fatalf("%d rows", n)
			}
		}
	})
}
