package webapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server is the API and console listening on one address.
type Server struct {
	ln     net.Listener
	srv    *http.Server
	served chan error
}

// Listen serves h on addr (host:port; port 0 picks a free one).
func Listen(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("webapi: listen on %s: %w", addr, err)
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, served: make(chan error, 1)}
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// URL is the server's base URL, http://host:port.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops accepting requests and waits (within ctx) for those in
// flight, such as a stop that waits for its savepoint, to be answered.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = s.srv.Close()
	}
	<-s.served
	if err != nil {
		return fmt.Errorf("webapi: close: %w", err)
	}
	return nil
}
