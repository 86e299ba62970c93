package awsbody

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closableBody fails every read once closed, as smithy-go's request body
// does (its WriteTo answers io.EOF, which io.Copy reports as an error).
type closableBody struct {
	r      *strings.Reader
	closed bool
}

func (b *closableBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("read after close")
	}
	return b.r.Read(p)
}

func (b *closableBody) Close() error { b.closed = true; return nil }

// closeFirst closes the SDK's body and only then reads what it was handed,
// the order in which smithy-go and net/http's write loop can race.
type closeFirst struct {
	original io.Closer
	got      [][]byte
}

func (c *closeFirst) Do(req *http.Request) (*http.Response, error) {
	_ = c.original.Close()
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	again, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	b2, err := io.ReadAll(again)
	if err != nil {
		return nil, err
	}
	c.got = append(c.got, b, b2)
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

func TestADetachedBodySurvivesTheSDKClosingItsOwn(t *testing.T) {
	const form = "Action=DescribeInstances&Version=2016-11-15"
	orig := &closableBody{r: strings.NewReader(form)}
	req, err := http.NewRequest(http.MethodPost, "http://ec2.test/", orig)
	require.NoError(t, err)
	next := &closeFirst{original: orig}
	_, err = Detach(next).Do(req)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{[]byte(form), []byte(form)}, next.got, "the body, and the same again from GetBody")

	_, err = (&closeFirst{original: &closableBody{r: strings.NewReader(form)}}).Do(req)
	assert.Error(t, err, "without the copy the read fails: the test can tell")
}

func TestABodylessRequestGoesThroughAsItIs(t *testing.T) {
	req, err := http.NewRequest(http.MethodGet, "http://ec2.test/", nil)
	require.NoError(t, err)
	var seen *http.Request
	_, err = Detach(doFunc(func(r *http.Request) (*http.Response, error) {
		seen = r
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})).Do(req)
	require.NoError(t, err)
	assert.Same(t, req, seen)
}

type doFunc func(*http.Request) (*http.Response, error)

func (f doFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }
