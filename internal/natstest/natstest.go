// Package natstest starts embedded NATS servers for tests and connects to
// them, cleaning up when the test ends.
package natstest

import (
	"net"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/natsutil"
)

// Server starts an embedded NATS server with JetStream on a random port,
// its store in a temporary directory of t, silent; it shuts down when the
// test ends.
func Server(t testing.TB) *natsutil.Server {
	t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// Connect connects to url as streamd does (natsutil.Connect: reconnecting
// for good); the connection closes when the test ends.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := natsutil.Connect(natsutil.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream is the JetStream context of a new connection to srv.
func JetStream(t testing.TB, srv *natsutil.Server) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Restartable is an embedded NATS server with JetStream that a test stops
// and starts again on the same port and store directory, and a connection
// to it that reconnects for good.
type Restartable struct {
	t    testing.TB
	dir  string
	port int
	Srv  *natsutil.Server // the running server; nil while stopped
	NC   *nats.Conn
}

// NewRestartable starts the server and connects; both end with the test.
func NewRestartable(t testing.TB) *Restartable {
	t.Helper()
	r := &Restartable{t: t, dir: t.TempDir(), port: -1}
	r.Start()
	r.port = r.Srv.Addr().(*net.TCPAddr).Port
	co, err := natsutil.NewConnectOptions(natsutil.URLs(r.Srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if r.NC, err = co.Connect(natsutil.KeepReconnecting()...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.NC.Close()
		r.Stop()
	})
	return r
}

// Start starts the server (again).
func (r *Restartable) Start() {
	r.t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: r.port, NoLog: true, StoreDir: r.dir})
	if err != nil {
		r.t.Fatal(err)
	}
	r.Srv = srv
}

// Stop shuts the server down, if it runs.
func (r *Restartable) Stop() {
	if r.Srv != nil {
		r.Srv.Shutdown()
		r.Srv = nil
	}
}
