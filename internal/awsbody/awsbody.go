// Package awsbody hands net/http its own copy of each request body the AWS
// SDK sends, so that the SDK closing its body early cannot break a call.
//
// smithy-go closes the body it built as soon as client.Do returns, that is
// once the response headers are in, while net/http's write loop may not be
// done with it: after writing ContentLength bytes it reads the body once
// more to check that nothing is left. On smithy-go's closed body that read
// is io.EOF returned from WriteTo, which io.Copy reports as an error; the
// transport takes it for a broken write and closes the connection under the
// response still being read ("use of closed network connection" while the
// SDK decodes the reply; aws/aws-sdk-go-v2#2737). The window is a few
// microseconds over a network and wide on a loopback under -race, where an
// answer arrives before the write loop's last read.
//
// Every EC2 client in this repository goes through Detach: caa's own
// provider and the tests of the fake EC2 that use the SDK.
package awsbody

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

// HTTPClient is the SDK's HTTP client (ec2.HTTPClient and its siblings).
type HTTPClient interface {
	Do(*http.Request) (*http.Response, error)
}

// Detach wraps next (the SDK's default client when nil) so that every
// request with a body reaches it with a body of its own.
func Detach(next HTTPClient) HTTPClient {
	if next == nil {
		next = awshttp.NewBuildableClient()
	}
	return detached{next: next}
}

type detached struct{ next HTTPClient }

// Do copies the body (EC2's Query bodies are small forms) and sends a clone
// of req that reads the copy, with GetBody for the transport's own retries.
func (d detached) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return d.next.Do(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, fmt.Errorf("aws: read the request body: %w", err)
	}
	own := req.Clone(req.Context())
	own.Body = io.NopCloser(bytes.NewReader(body))
	own.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return d.next.Do(own)
}
