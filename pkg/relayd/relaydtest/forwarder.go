// Package relaydtest holds test fixtures for the relay daemon: a pod VM's
// forwarder that, besides relaying kata's agent protocol to a fake agent as
// the real forwarder does, echoes a raw byte stream (a connection that
// opens with StreamMagic), so tests can check that a relay loses no byte.
package relaydtest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/pki"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// StreamMagic opens a connection the forwarder echoes instead of relaying
// to the agent.
var StreamMagic = []byte("STREAM!!")

// Forwarder is a fake pod VM forwarder with mutual TLS from the agent CA.
type Forwarder struct {
	Agent *podvmfake.Agent
	ln    net.Listener

	mu       sync.Mutex
	accepted int
	conns    map[net.Conn]struct{}
	agents   map[net.Conn]struct{} // the connections to the agent
	silent   chan struct{}         // closed by Silence
	closed   chan struct{}         // closed by Close
	once     sync.Once
}

// StartForwarder serves on 127.0.0.1 with a server certificate for names
// (VM names), issued by ca, and requires a client certificate from ca.
func StartForwarder(t testing.TB, ca *pki.CA, names ...string) *Forwarder {
	t.Helper()
	return StartForwarderAt(t, ca, nil, names...)
}

// StartForwarderAt is StartForwarder whose check of the client
// certificates reads the time from now (nil: the clock), as a VM whose
// clock the test moves: an expired client certificate is refused.
func StartForwarderAt(t testing.TB, ca *pki.CA, now func() time.Time, names ...string) *Forwarder {
	t.Helper()
	certPEM, keyPEM, _, err := ca.IssueServer(nil, names, time.Hour)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(ca.CertPEM()))
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, Time: now,
	})
	require.NoError(t, err)
	agent, err := podvmfake.StartAgent()
	require.NoError(t, err)
	f := &Forwarder{Agent: agent, ln: ln, conns: map[net.Conn]struct{}{}, agents: map[net.Conn]struct{}{},
		silent: make(chan struct{}), closed: make(chan struct{})}
	go f.serve()
	t.Cleanup(f.Close)
	return f
}

// Addr is the forwarder's address.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Accepted counts the TLS connections it accepted.
func (f *Forwarder) Accepted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accepted
}

// Close stops it (the VM is gone) and closes every connection.
func (f *Forwarder) Close() {
	f.once.Do(func() { close(f.closed) })
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.Agent.Close()
}

// Silence is a VM that stops answering without closing anything (frozen,
// or cut off with no reset): new connections are refused, and the open
// ones stay open but carry nothing more, until Close.
func (f *Forwarder) Silence() {
	f.mu.Lock()
	select {
	case <-f.silent:
	default:
		close(f.silent)
	}
	f.ln.Close()
	for a := range f.agents {
		a.Close()
	}
	f.mu.Unlock()
}

func (f *Forwarder) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.accepted++
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		go f.handle(c)
	}
}

func (f *Forwarder) handle(c net.Conn) {
	defer func() {
		c.Close()
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
	}()
	head := make([]byte, len(StreamMagic))
	if _, err := io.ReadFull(c, head); err != nil {
		return
	}
	if bytes.Equal(head, StreamMagic) {
		_, _ = io.Copy(c, c)
		return
	}
	a, err := net.Dial("unix", f.Agent.Socket())
	if err != nil {
		return
	}
	defer a.Close()
	f.mu.Lock()
	f.agents[a] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.agents, a)
		f.mu.Unlock()
	}()
	select {
	case <-f.silent:
		return
	default:
	}
	if _, err := a.Write(head); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, a); done <- struct{}{} }()
	<-done
	select {
	case <-f.silent: // keep the relay's connection open, and say nothing
		go func() { _, _ = io.Copy(io.Discard, c) }()
		<-f.closed
	default:
	}
}
