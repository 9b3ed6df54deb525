// Package natsutil starts embedded NATS servers and connects to NATS with
// validated options. It is the one place where streamd turns its NATS
// configuration (URLs, credentials, TLS) into nats.go options, so the
// controller, the hosts, the NATS dataplane and the NATS connectors all
// connect the same way.
package natsutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedOptions configures an in-process NATS server. The zero value is a
// logging server with JetStream on the default port 4222 of 127.0.0.1 whose
// store lives in a temporary directory removed at Shutdown.
type EmbeddedOptions struct {
	Host        string // listen address; default "127.0.0.1"
	Port        int    // client port; 0 = 4222, -1 = a random free port (tests)
	ServerName  string // default: chosen by nats-server
	NoJetStream bool   // run core NATS only
	// StoreDir is JetStream's store directory. Empty: a fresh temporary
	// directory, removed by Shutdown (nothing survives a restart).
	StoreDir string
	// NoLog silences the server; otherwise it logs to standard error.
	NoLog bool
	// MaxPayload is the largest message the server accepts; 0 = the
	// nats-server default (1 MiB).
	MaxPayload int32
	// Username/Password or Token require clients to authenticate.
	Username, Password string
	Token              string
	// ReadyTimeout bounds the wait for the server to accept connections;
	// default 10s.
	ReadyTimeout time.Duration
	// Configure, if set, edits the nats-server options last (nkeys, TLS,
	// accounts, limits): an escape hatch for what the fields above lack.
	Configure func(*server.Options)
}

// Server is a running embedded NATS server.
type Server struct {
	*server.Server
	tmpDir string // removed by Shutdown when the store directory was ours
}

// StartEmbedded starts an in-process NATS server and waits until it accepts
// connections. Stop it with Shutdown.
func StartEmbedded(o EmbeddedOptions) (*Server, error) {
	if o.Username == "" && o.Password != "" {
		return nil, errors.New("natsutil: embedded server: password without username")
	}
	if o.Token != "" && o.Username != "" {
		return nil, errors.New("natsutil: embedded server: both a token and a username set; choose one")
	}
	if o.MaxPayload < 0 {
		return nil, fmt.Errorf("natsutil: embedded server: max payload %d < 0", o.MaxPayload)
	}
	so := &server.Options{
		ServerName:    o.ServerName,
		Host:          o.Host,
		Port:          o.Port,
		NoLog:         o.NoLog,
		NoSigs:        true,
		JetStream:     !o.NoJetStream,
		StoreDir:      o.StoreDir,
		MaxPayload:    o.MaxPayload,
		Username:      o.Username,
		Password:      o.Password,
		Authorization: o.Token,
	}
	if so.Host == "" {
		so.Host = "127.0.0.1"
	}
	s := &Server{}
	if so.JetStream && so.StoreDir == "" {
		dir, err := os.MkdirTemp("", "streamd-nats-")
		if err != nil {
			return nil, fmt.Errorf("natsutil: embedded server: store directory: %w", err)
		}
		so.StoreDir, s.tmpDir = dir, dir
	}
	if o.Configure != nil {
		o.Configure(so)
	}
	if so.Port > 0 {
		// The server would only log that it cannot listen (and
		// ReadyForConnections wait in vain): try the address first.
		addr := net.JoinHostPort(so.Host, strconv.Itoa(so.Port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			s.removeTmp()
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("natsutil: embedded server: %s is in use by another process (another NATS server or streamd server?): %w", addr, err)
			}
			return nil, fmt.Errorf("natsutil: embedded server: %w", err)
		}
		ln.Close()
	}
	ns, err := server.NewServer(so)
	if err != nil {
		s.removeTmp()
		return nil, fmt.Errorf("natsutil: embedded server: %w", err)
	}
	if !so.NoLog {
		ns.ConfigureLogger()
	}
	s.Server = ns
	ns.Start()
	wait := o.ReadyTimeout
	if wait <= 0 {
		wait = 10 * time.Second
	}
	if !ns.ReadyForConnections(wait) {
		ns.Shutdown()
		ns.WaitForShutdown()
		s.removeTmp()
		return nil, fmt.Errorf("natsutil: embedded server on %s:%d not ready for connections after %s", so.Host, so.Port, wait)
	}
	return s, nil
}

// URL is the client URL of the server, e.g. "nats://127.0.0.1:40123".
func (s *Server) URL() string { return s.ClientURL() }

// Shutdown stops the server, waits until it has stopped and removes its
// temporary store directory, if it made one.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
	s.removeTmp()
}

func (s *Server) removeTmp() {
	if s.tmpDir != "" {
		os.RemoveAll(s.tmpDir)
		s.tmpDir = ""
	}
}
