// Package natstest starts embedded NATS servers for tests and connects to
// them, cleaning up when the test ends.
package natstest

import (
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
