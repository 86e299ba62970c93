package azure

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resourcegraph/armresourcegraph"
)

// Resource Graph's query call. It goes through the SDK's ARM pipeline
// (credential, retries, telemetry, logging) and sends what the generated
// armresourcegraph client sends, byte for byte; only the answer is read by
// caa, once, straight into the rows' own types: the generated client
// decodes every row into maps of any, which at a thousand VMs cost more
// than everything else List does with them.
const (
	graphPath       = "/providers/Microsoft.ResourceGraph/resources"
	graphAPIVersion = "2024-04-01"
	// graphModule and graphModuleVersion name the generated client in the
	// User-Agent and the traces, as that client does (a test keeps the
	// version in step with go.mod).
	graphModule        = "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resourcegraph/armresourcegraph"
	graphModuleVersion = "v0.10.0"
	graphOperation     = "Client.Resources"
)

// graphPage is one answer of a query, its rows decoded as R. When the
// answer does not fit R (a row that is not an object, a field of another
// type), Data is nil and generic holds the rows as the SDK's model decodes
// them, for the caller to read leniently as it always did.
type graphPage[R any] struct {
	Data            []R    `json:"data"`
	SkipToken       string `json:"$skipToken"`
	ResultTruncated string `json:"resultTruncated"`
	TotalRecords    *int64 `json:"totalRecords"`

	generic []any
}

// rows is how many rows the answer held.
func (g *graphPage[R]) rows() int { return len(g.Data) + len(g.generic) }

// truncated says whether Resource Graph left rows out of the answer that
// no skip token reaches.
func (g *graphPage[R]) truncated() bool {
	return g.ResultTruncated == string(armresourcegraph.ResultTruncatedTrue)
}

// queryGraph sends one query under a read deadline, notes the quota its
// answer reports (refusals included), and decodes the answer's rows as R.
// Errors are classified for op.
func queryGraph[R any](ctx context.Context, p *Provider, op string, q armresourcegraph.QueryRequest) (graphPage[R], error) {
	ctx, cancel := p.readCtx(ctx)
	defer cancel()
	resp, err := p.postQuery(ctx, q)
	if resp != nil {
		p.quota.note(resp.Header, p.now())
	}
	if err != nil {
		return graphPage[R]{}, classify(op, err)
	}
	payload, err := runtime.Payload(resp)
	if err != nil {
		return graphPage[R]{}, classify(op, err)
	}
	var page graphPage[R]
	if json.Unmarshal(payload, &page) == nil {
		return page, nil
	}
	// Not R's shape: read it the SDK's way, which takes any JSON row and
	// says what is wrong with an answer it cannot take.
	var sdk armresourcegraph.QueryResponse
	if err := runtime.UnmarshalAsJSON(resp, &sdk); err != nil {
		return graphPage[R]{}, classify(op, err)
	}
	data, ok := sdk.Data.([]any)
	if sdk.Data != nil && !ok {
		return graphPage[R]{}, fmt.Errorf("%s %s: Resource Graph answered data of type %T, not the objectArray asked for", ProviderName, op, sdk.Data)
	}
	page = graphPage[R]{generic: data, TotalRecords: sdk.TotalRecords}
	if sdk.SkipToken != nil {
		page.SkipToken = *sdk.SkipToken
	}
	if sdk.ResultTruncated != nil {
		page.ResultTruncated = string(*sdk.ResultTruncated)
	}
	return page, nil
}

// postQuery POSTs q to Resource Graph as the generated client's Resources
// does: same path, api-version, headers, body, operation name and span.
func (p *Provider) postQuery(ctx context.Context, q armresourcegraph.QueryRequest) (_ *http.Response, err error) {
	ctx = context.WithValue(ctx, runtime.CtxAPINameKey{}, graphOperation)
	ctx, endSpan := runtime.StartSpan(ctx, graphOperation, p.graph.Tracer(), nil)
	defer func() { endSpan(err) }()
	req, err := runtime.NewRequest(ctx, http.MethodPost, runtime.JoinPaths(p.graph.Endpoint(), graphPath))
	if err != nil {
		return nil, err
	}
	qp := req.Raw().URL.Query()
	qp.Set("api-version", graphAPIVersion)
	req.Raw().URL.RawQuery = strings.ReplaceAll(qp.Encode(), "+", "%20")
	req.Raw().Header["Accept"] = []string{"application/json"}
	req.Raw().Header["Content-Type"] = []string{"application/json"}
	if err = runtime.MarshalAsJSON(req, q); err != nil {
		return nil, err
	}
	resp, err := p.graph.Pipeline().Do(req)
	if err != nil {
		return resp, err
	}
	if !runtime.HasStatusCode(resp, http.StatusOK) {
		err = runtime.NewResponseError(resp)
		return resp, err
	}
	return resp, nil
}

// graphQuery is the request for query: the provider's subscription, rows
// as objects, the largest page.
func (p *Provider) graphQuery(query string) armresourcegraph.QueryRequest {
	return armresourcegraph.QueryRequest{
		Query:         &query,
		Subscriptions: []*string{new(p.cfg.SubscriptionID)},
		Options:       &armresourcegraph.QueryRequestOptions{ResultFormat: new(armresourcegraph.ResultFormatObjectArray), Top: new(int32(graphTop))},
	}
}
