package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/webapi"
)

// Configuration keys of the REST API and web console (docs/rest.md).
const (
	keyControllerHTTP = "controller.http" // streamd controller and streamd server
	keyRunHTTP        = "run.http"        // streamd run
)

// defaultHTTP is a free loopback port: the default of streamd server and
// streamd run.
const defaultHTTP = "127.0.0.1:0"

// apiCloseTimeout bounds the wait for requests in flight when the API
// stops (a stop answering with its savepoint).
const apiCloseTimeout = 10 * time.Second

func init() { knownKeys = append(knownKeys, keyControllerHTTP, keyRunHTTP) }

// httpFlag adds --http with default def and returns its binding to key.
func httpFlag(cmd *cobra.Command, key, def string) flagKey {
	what := `"" or off: none`
	if def == "" {
		what = "default: off"
	}
	cmd.Flags().String("http", def, "serve the REST API and web console on this address, e.g. 127.0.0.1:8081; port 0 picks a free one ("+key+"; "+what+")")
	return flagKey{"http", key}
}

// startAPI serves the REST API and console over b on the address of key
// (none when it is empty or "off") and logs its URL with log; the
// returned function stops it.
func (c *cli) startAPI(key, mode string, b webapi.Backend, log func(string, ...any), path string) (func(), error) {
	addr := c.v.GetString(key)
	if addr == "" || addr == "off" {
		return func() {}, nil
	}
	h := webapi.New(b, webapi.Options{Mode: mode, TracingUIURL: c.v.GetString(telemetry.KeyTracingUIURL),
		Service: c.service, Version: version, Traces: c.traces})
	srv, err := webapi.Listen(addr, h)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%s: %s is in use by another process: choose another address, or port 0 for a free one: %w", key, addr, err)
	}
	if err != nil {
		return nil, usagef("%s: %w", key, err)
	}
	log("web console and REST API", "url", srv.URL()+"/"+path)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiCloseTimeout)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			c.log.Warn("REST API", "err", err)
		}
	}, nil
}

// startControllerAPI serves the API of the controller on nc: a
// client.Client over the controller's own connection, so the API sees
// what streamd status sees.
func (c *cli) startControllerAPI(nc *nats.Conn) (func(), error) {
	client, err := client.NewClient(nc)
	if err != nil {
		return nil, err
	}
	return c.startAPI(keyControllerHTTP, "controller", client, c.log.Info, "")
}

// endLocal tells the REST API how the run ended.
func endLocal(l *webapi.Local, stats runtime.Stats, err error, canceled bool) {
	switch {
	case stats.Savepoint != "" && err == nil:
		l.End(stats, wire.JobStopped, "")
	case err == nil:
		l.End(stats, wire.JobFinished, "")
	case canceled && errors.Is(err, context.Canceled):
		l.End(stats, wire.JobCanceled, "canceled")
	default:
		l.End(stats, wire.JobFailed, err.Error())
	}
}
