package cluster

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/streamd/streamd/internal/cluster/wire"
)

// The control API is a NATS micro service (github.com/nats-io/nats.go/micro):
// `nats micro ls`, `nats micro info streamd-controller` and `nats micro stats
// streamd-controller` show the leading controller, its endpoints (one per
// control subject, on the subjects of docs/subjects.md) and their request
// and error counts. Only the leader runs the service, as only the leader
// answered the control subjects before; a standby is not listed.
const (
	// ServiceName is the micro service name of the control API.
	ServiceName = "streamd-controller"
	// ServiceQueueGroup is the queue group of its endpoints.
	ServiceQueueGroup = "streamd-controller"
	// serviceDevVersion is the service version of a build without a
	// semantic version (micro requires one).
	serviceDevVersion = "0.0.0-dev"
)

// controlEndpoint is one endpoint of the service: its micro name, subject,
// handler and what it does (the endpoint's "description" metadata).
type controlEndpoint struct {
	name, subject string
	handle        func(micro.Request)
	what          string
}

func (c *Controller) controlEndpoints() []controlEndpoint {
	return []controlEndpoint{
		{"deploy", wire.SubjectDeploy, c.handleDeploy, "submit a job"},
		{"list", wire.SubjectList, c.handleList, "list the jobs"},
		{"status", wire.SubjectStatus, c.handleStatus, "a job's status"},
		{"cancel", wire.SubjectCancel, c.handleCancel, "cancel a job"},
		{"delete", wire.SubjectDelete, c.handleDelete, "delete an ended job's record"},
		{"savepoint", wire.SubjectSavepoint, c.handleSavepoint, "take a savepoint of a running job"},
		{"stop", wire.SubjectStop, c.handleStop, "stop a job with a savepoint"},
		{"upgrade", wire.SubjectUpgrade, c.handleUpgrade, "upgrade a running job through a savepoint"},
		{"hosts", wire.SubjectHosts, c.handleHosts, "list the hosts and their slots"},
	}
}

// controlService is the control API of one leadership term: the micro
// service and the connection it alone uses.
type controlService struct {
	svc micro.Service
	nc  *nats.Conn
}

// stop stops the service and closes its connection. The connection goes
// with it because micro stops a service by draining its subscriptions,
// and nats.go loses a drain begun while the connection reconnects: it
// sends the subscription again on reconnecting and forgets it once
// drained, without an UNSUB. The server then kept the endpoint's queue
// subscription on a controller that no longer serves it, and handed it
// requests at random that nobody answered (TestChaos's unanswered status
// requests: two controllers' connections held streamd.v1.ctl.status).
// Closing the connection removes every subscription of it on the server.
func (s *controlService) stop() {
	_ = s.svc.Stop()
	s.nc.Close()
}

// serviceConn is a new connection with the controller's connection's
// servers and credentials, for the control API of one term. It does not
// wait for the server: a leader taking over as NATS restarts subscribes
// once it is back.
func (c *Controller) serviceConn() (*nats.Conn, error) {
	o := c.nc.Opts // a copy
	o.Name = fmt.Sprintf("streamd controller %s control API", c.id)
	o.ClosedCB, o.DisconnectedCB, o.DisconnectedErrCB, o.ConnectedCB, o.ReconnectedCB = nil, nil, nil, nil, nil
	o.DiscoveredServersCB, o.AsyncErrorCB, o.ReconnectErrCB, o.LameDuckModeHandler = nil, nil, nil, nil
	o.RetryOnFailedConnect, o.MaxReconnect = true, -1
	nc, err := o.Connect()
	if err != nil {
		return nil, fmt.Errorf("cluster: controller %s: connect for the control API: %w", c.id, err)
	}
	return nc, nil
}

// startService adds the control API service of the leader of term, on a
// connection of its own (serviceConn), an endpoint per control subject.
// Each endpoint has its own subscription, so its own goroutine: requests
// that wait on hosts (cancel, savepoint, stop) do not hold up the others.
func (c *Controller) startService(term uint64) (*controlService, error) {
	nc, err := c.serviceConn()
	if err != nil {
		return nil, err
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     serviceVersion(c.opts.Version),
		Description: "streamd controller: the control API (docs/subjects.md)",
		QueueGroup:  ServiceQueueGroup,
		Metadata: map[string]string{
			"controller": c.id,
			"term":       strconv.FormatUint(term, 10),
			"bucket":     c.opts.Bucket,
			"build":      c.opts.Version,
		},
		// Async errors of the service's subscriptions (a slow consumer, a
		// subscription the NATS permissions refuse).
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			c.log.Warn("control API service", "subject", err.Subject, "err", err.Description)
		},
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: controller: add micro service %s: %w", ServiceName, err)
	}
	cs := &controlService{svc: svc, nc: nc}
	for _, e := range c.controlEndpoints() {
		err := svc.AddEndpoint(e.name, c.logged(e.name, e.handle), micro.WithEndpointSubject(e.subject),
			micro.WithEndpointMetadata(map[string]string{"description": e.what}))
		if err != nil {
			cs.stop()
			return nil, fmt.Errorf("cluster: controller: endpoint %s (%s): %w", e.name, e.subject, err)
		}
	}
	if err := nc.Flush(); err != nil && nc.IsConnected() {
		cs.stop()
		return nil, fmt.Errorf("cluster: controller: control API subscriptions: %w", err)
	}
	return cs, nil
}

// logged is handle with each request logged at debug level (received and
// answered, with how long it took) and a reply that could not be sent
// logged as a warning: a client that got no answer finds why here.
func (c *Controller) logged(name string, handle func(micro.Request)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		start := time.Now()
		c.log.Debug("control request", "endpoint", name, "reply_to", req.Reply())
		handle(&loggedRequest{Request: req, c: c, name: name})
		c.log.Debug("control request answered", "endpoint", name, "reply_to", req.Reply(), "took", time.Since(start))
	})
}

// loggedRequest logs the failure of a reply to a control request.
type loggedRequest struct {
	micro.Request
	c    *Controller
	name string
}

func (r *loggedRequest) Respond(data []byte, opts ...micro.RespondOpt) error {
	return r.failed(r.Request.Respond(data, opts...), len(data))
}

func (r *loggedRequest) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	return r.failed(r.Request.Error(code, description, data, opts...), len(data))
}

func (r *loggedRequest) failed(err error, n int) error {
	if err != nil {
		r.c.log.Warn("control request: reply not sent", "endpoint", r.name, "reply_to", r.Reply(), "bytes", n, "err", err)
	}
	return err
}

// semVerRE is micro's check of a service version (semver.org's expression).
var semVerRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// serviceVersion is build version v as micro wants it: a semantic version
// without the leading "v", else serviceDevVersion (the "build" metadata
// keeps v as it is).
func serviceVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	if semVerRE.MatchString(v) {
		return v
	}
	return serviceDevVersion
}

// reply answers a control request with v as JSON (nothing if it has no
// reply subject). The body is what wire.Respond would send; a reply with an
// error also carries micro's error headers (Nats-Service-Error and
// Nats-Service-Error-Code: 503 when the client should retry, else 500), so
// the endpoint's stats count it. Clients read only the body.
func reply(req micro.Request, v any) {
	if req.Reply() == "" {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		r := wire.Reply{Error: "cluster: encode reply: " + err.Error()}
		data, _ = json.Marshal(r)
		v = r
	}
	r, ok := v.(interface{ Base() wire.Reply })
	if !ok || r.Base().Error == "" {
		_ = req.Respond(data)
		return
	}
	code := "500"
	switch {
	case r.Base().Retry || r.Base().Code == wire.CodeUnavailable:
		code = "503"
	case r.Base().Code == wire.CodeNotFound:
		code = "404"
	case r.Base().Code == wire.CodeConflict:
		code = "409"
	case r.Base().Code == wire.CodeBadRequest:
		code = "400"
	}
	_ = req.Error(code, headerValue(r.Base().Error), data)
}

// headerValue is s on one line (a header value ends at a line break).
func headerValue(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}
