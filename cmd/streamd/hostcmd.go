package main

import (
	"context"
	"path/filepath"
	goruntime "runtime"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
)

func (c *cli) hostCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Run a host: offers --slots slots to the controller and runs the jobs it assigns",
		Long: `Run a host until interrupted. It joins the NATS server of nats.url (--nats,
STREAMD_NATS_URL), sends a heartbeat every cluster.heartbeat_interval, and runs
what the controller assigns: it fetches modules and input files from the NATS
object store into data_dir/host/artifacts and runs the job. A slot runs subtask i of
every operator of a job, so a job needs as many slots as its largest parallelism.
A job that needs more slots than one host has is spread over several hosts: the
channels between hosts go over NATS, and the controller drives its checkpoints.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Choose the id now, so that the service name has it too.
			id := c.v.GetString(keyHostID)
			if id == "" {
				id = wire.NewHostID()
				c.v.Set(keyHostID, id)
			}
			stopTelemetry, err := c.startTelemetry(cmd.Context(), "streamd-host-"+id)
			if err != nil {
				return err
			}
			defer stopTelemetry()
			nc, err := c.connectNATS("streamd host", natsutil.KeepReconnecting()...)
			if err != nil {
				return err
			}
			defer nc.Close()
			h, eng, err := c.startHost(cmd.Context(), nc, "")
			if err != nil {
				return err
			}
			defer eng.Close(context.WithoutCancel(cmd.Context()))
			defer h.Close()
			<-cmd.Context().Done()
			return nil
		},
	}
	c.natsFlags(cmd, append(c.hostFlags(cmd), c.clusterFlags(cmd, false)...)...)
	return cmd
}

// hostFlags adds --slots, --host-id, --data-dir and the runtime flags.
func (c *cli) hostFlags(cmd *cobra.Command) []flagKey {
	fl := cmd.Flags()
	fl.Int("slots", goruntime.NumCPU(), "slots this host offers ("+keySlots+"; default: the number of CPUs)")
	fl.String("host-id", "", "this host's id ("+keyHostID+"; default: the hostname and a random suffix)")
	fl.String("data-dir", "", "directory for the artifact cache, the pebble state of subtasks (and the NATS store of server) ("+keyDataDir+"; default: the user cache dir + /streamd)")
	fl.Int("batch-size", 1024, "records per batch on channels and into wasm ("+keyBatchSize+")")
	fl.Int("channel-capacity", 16, "batches queued per channel ("+keyChannelCapacity+")")
	bufferTimeoutFlag(fl)
	return append([]flagKey{{"slots", keySlots}, {"host-id", keyHostID}, {"data-dir", keyDataDir},
		{"batch-size", keyBatchSize}, {"channel-capacity", keyChannelCapacity}, {"buffer-timeout", keyBufferTimeout}}, c.connectorFlags(cmd)...)
}

// startHost starts a host agent with the host.* settings; defaultID is used
// when host.id is not set ("" = hostname and a random suffix).
func (c *cli) startHost(ctx context.Context, nc *nats.Conn, defaultID string) (*agent.Host, *host.Engine, error) {
	slots, err := c.positiveInt(keySlots)
	if err != nil {
		return nil, nil, err
	}
	hb, err := c.positiveDuration(keyHeartbeatInterval)
	if err != nil {
		return nil, nil, err
	}
	batch, err := c.positiveInt(keyBatchSize)
	if err != nil {
		return nil, nil, err
	}
	chanCap, err := c.positiveInt(keyChannelCapacity)
	if err != nil {
		return nil, nil, err
	}
	bufTimeout, err := c.bufferTimeout()
	if err != nil {
		return nil, nil, err
	}
	mrb, err := c.maxRecordBytes()
	if err != nil {
		return nil, nil, err
	}
	dir, err := c.dataDir()
	if err != nil {
		return nil, nil, err
	}
	id := c.v.GetString(keyHostID)
	if id == "" {
		id = defaultID
	}
	engOpts, err := c.engineOptions()
	if err != nil {
		return nil, nil, err
	}
	// Jobs' nats sources and sinks connect like the host, to the servers it
	// is connected to (for `server`: the embedded one).
	natsOpts, err := c.natsOptions("streamd host " + id + " jobs")
	if err != nil {
		return nil, nil, err
	}
	natsOpts.URLs = nc.Servers()
	logCfg, err := c.logStreamConfig()
	if err != nil {
		return nil, nil, err
	}
	eng, err := host.NewEngine(ctx, engOpts...)
	if err != nil {
		return nil, nil, err
	}
	h, err := agent.StartHost(nc, agent.HostOptions{
		ID: id, Slots: slots, DataDir: filepath.Join(dir, "host"), HeartbeatInterval: hb, Logger: c.log,
		Executor: &agent.LocalExecutor{Engine: eng, Stdout: c.stdout, BatchSize: batch, ChannelCapacity: chanCap, BufferTimeout: bufTimeout, MaxRecordBytes: mrb, NATS: natsOpts,
			DataDir: filepath.Join(dir, "state"), ConnectorSettings: c.connectorSettings(), Logs: wire.NewLogPublisher(nc, logCfg, c.log)},
	})
	if err != nil {
		eng.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return h, eng, nil
}
