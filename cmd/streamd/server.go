package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/natsutil"
)

func (c *cli) serverCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run an embedded NATS server, a controller and a host in one process (one machine)",
		Long: `Run a single-machine cluster until interrupted: an embedded NATS server with
JetStream listening on server.nats_host:server.nats_port (default 127.0.0.1:4222,
where the other commands look by default), a controller and a host with --slots
slots. The NATS store and the host's artifact cache live under data_dir.

If nats.user and nats.password (or nats.token) are set, the embedded server
requires them from every client.`,
		Example: `  streamd server --slots 4 &
  streamd deploy examples/wasm/uppercase/uppercase.yaml`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return c.server(cmd.Context()) },
	}
	fl := cmd.Flags()
	fl.Int("nats-port", 4222, "client port of the embedded NATS server ("+keyNATSPort+")")
	fl.String("nats-host", "127.0.0.1", "listen address of the embedded NATS server ("+keyNATSHost+")")
	flags := append([]flagKey{{"nats-port", keyNATSPort}, {"nats-host", keyNATSHost}}, c.hostFlags(cmd)...)
	flags = append(append(flags, c.clusterFlags(cmd, true)...), httpFlag(cmd, keyControllerHTTP, defaultHTTP))
	c.natsFlags(cmd, flags...)
	return cmd
}

func (c *cli) server(ctx context.Context) error {
	port, err := castInt(c.v.Get(keyNATSPort))
	if err != nil || port < 1 || port > 65535 {
		return usagef("%s: want a port number, got %v", keyNATSPort, c.v.Get(keyNATSPort))
	}
	dir, err := c.dataDir()
	if err != nil {
		return err
	}
	o, err := c.natsOptions("streamd server")
	if err != nil {
		return err
	}
	if o.NKeySeedFile != "" || o.CredsFile != "" {
		return usagef("server: the embedded NATS server supports user/password or token authentication only (nats.nkey and nats.creds need an external NATS server)")
	}
	if o.TLSEnabled() {
		return usagef("server: the embedded NATS server does not serve TLS; use an external NATS server for TLS")
	}
	stopTelemetry, err := c.startTelemetry(ctx, "streamd-server")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{
		Host: c.v.GetString(keyNATSHost), Port: port, StoreDir: filepath.Join(dir, "nats"),
		NoLog: c.v.GetString(keyLogLevel) != "debug", Username: o.User, Password: o.Password, Token: o.Token,
		MaxPayload: 8 << 20,
	})
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	defer srv.Shutdown()
	o.URLs = []string{srv.URL()}
	nc, err := o.Connect()
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	defer nc.Close()
	opts, err := c.controllerOptions()
	if err != nil {
		return err
	}
	// The controller's bucket is in the NATS store under data_dir: a server
	// started again finds its jobs there and adopts those still running.
	// The REST API listens before anything runs, so a busy --http port
	// fails the server before it says it is ready.
	stopAPI, err := c.startControllerAPI(nc)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	defer stopAPI()
	stopEvents, err := c.jobEvents(nc, &opts)
	if err != nil {
		return err
	}
	defer stopEvents()
	ctlDone := make(chan error, 1)
	ctlCtx, stopCtl := context.WithCancel(ctx)
	go func() { ctlDone <- cluster.RunController(ctlCtx, nc, opts) }()
	defer func() { stopCtl(); <-ctlDone }()
	h, eng, err := c.startHost(ctx, nc, "local")
	if err != nil {
		return err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	defer h.Close()
	c.log.Info("server ready", "nats", srv.URL(), "host", h.ID(), "slots", c.v.GetInt(keySlots), "data_dir", dir)
	select {
	case <-ctx.Done():
	case err := <-ctlDone:
		ctlDone <- err
		if err != nil {
			return fmt.Errorf("server: controller: %w", err)
		}
	}
	c.log.Info("server stopping")
	return nil
}
