package main

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
)

func (c *cli) controllerCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: keeps jobs, schedules them onto hosts, fails them over",
		Long: `Run the controller until interrupted. It joins the NATS server of nats.url
(--nats, STREAMD_NATS_URL), answers the control API (streamd deploy, list, status,
cancel, savepoint, stop), registers hosts by their heartbeats, schedules jobs onto
free host slots and fails jobs over when a host misses cluster.lost_after
heartbeats. Its job table and each job's state live in the JetStream key-value
bucket controller.bucket, so several controllers may run on one NATS: one leads
(a lease in the bucket, renewed every half heartbeat interval), the others stand
by and take over, adopting the running jobs, when the lease is not renewed for
1.5 heartbeat intervals. See docs/subjects.md for the subjects.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			stopTelemetry, err := c.startTelemetry(cmd.Context(), "streamd-controller")
			if err != nil {
				return err
			}
			defer stopTelemetry()
			nc, err := c.connectNATS("streamd controller", natsutil.KeepReconnecting()...)
			if err != nil {
				return err
			}
			defer nc.Close()
			opts, err := c.controllerOptions()
			if err != nil {
				return err
			}
			stopEvents, err := c.jobEvents(nc, &opts)
			if err != nil {
				return err
			}
			defer stopEvents()
			return c.runController(cmd.Context(), nc, opts)
		},
	}
	c.natsFlags(cmd, append(c.clusterFlags(cmd, true), httpFlag(cmd, keyControllerHTTP, ""))...)
	return cmd
}

// clusterFlags adds the heartbeat flag and, for a controller, the failover flags.
func (c *cli) clusterFlags(cmd *cobra.Command, controller bool) []flagKey {
	fl := cmd.Flags()
	fl.Duration("heartbeat-interval", time.Second, "how often hosts send heartbeats ("+keyHeartbeatInterval+")")
	if !controller {
		return []flagKey{{"heartbeat-interval", keyHeartbeatInterval}}
	}
	fl.Int("lost-after", cluster.DefaultLostAfter, "missed heartbeats after which a host is lost ("+keyLostAfter+")")
	fl.Int("max-failovers", cluster.DefaultMaxFailovers, "restarts of one job after lost hosts before it fails ("+keyMaxFailovers+")")
	fl.String("checkpoint-storage", "", "checkpoint storage of deployed jobs whose job file chooses none: dir or jetstream ("+keyCheckpointStorage+")")
	fl.String("controller-id", "", "name of this controller in the leader lease ("+keyControllerID+"; default: hostname and a random suffix)")
	fl.String("controller-bucket", cluster.DefaultControllerBucket, "JetStream key-value bucket of the job table and the lease ("+keyControllerBucket+")")
	fl.Int("controller-replicas", 0, "replicas of that bucket when it is created; 0 = the NATS cluster's size, at most 5 ("+keyControllerReplicas+")")
	fl.Duration("job-retention", cluster.DefaultJobRetention, "how long finished, failed and canceled jobs stay in 'streamd list' ("+keyJobRetention+")")
	fl.Duration("slot-wait", cluster.DefaultSlotWait, "how long slots must stay free before a job runs on fewer than it declares, or scales back up ("+keySlotWait+")")
	fl.Duration("rescale-interval", cluster.DefaultRescaleInterval, "least time between a job's rescales before it scales up again ("+keyRescaleInterval+")")
	return []flagKey{{"heartbeat-interval", keyHeartbeatInterval}, {"lost-after", keyLostAfter}, {"max-failovers", keyMaxFailovers},
		{"checkpoint-storage", keyCheckpointStorage}, {"controller-id", keyControllerID}, {"controller-bucket", keyControllerBucket},
		{"controller-replicas", keyControllerReplicas}, {"job-retention", keyJobRetention}, {"slot-wait", keySlotWait}, {"rescale-interval", keyRescaleInterval}}
}

// runController runs a controller until ctx ends (cluster.RunController),
// and its REST API and console when controller.http is set.
func (c *cli) runController(ctx context.Context, nc *nats.Conn, opts cluster.ControllerOptions) error {
	stopAPI, err := c.startControllerAPI(nc)
	if err != nil {
		return err
	}
	defer stopAPI()
	return cluster.RunController(ctx, nc, opts)
}

// jobEvents sets opts.Logs: the controller publishes its events about each
// job to the job log stream (logs.* settings), as hosts publish theirs.
// The returned function stops publishing.
func (c *cli) jobEvents(nc *nats.Conn, opts *cluster.ControllerOptions) (func(), error) {
	cfg, err := c.logStreamConfig()
	if err != nil {
		return nil, err
	}
	opts.Logs = wire.NewLogPublisher(nc, cfg, c.log)
	return opts.Logs.Close, nil
}

func (c *cli) controllerOptions() (cluster.ControllerOptions, error) {
	hb, err := c.positiveDuration(keyHeartbeatInterval)
	if err != nil {
		return cluster.ControllerOptions{}, err
	}
	lost, err := c.positiveInt(keyLostAfter)
	if err != nil {
		return cluster.ControllerOptions{}, err
	}
	fo, err := c.positiveInt(keyMaxFailovers)
	if err != nil {
		return cluster.ControllerOptions{}, err
	}
	storage := c.v.GetString(keyCheckpointStorage)
	switch storage {
	case "", jobfile.StorageDir, jobfile.StorageJetStream:
	default:
		return cluster.ControllerOptions{}, usagef("%s: %q: want dir or jetstream", keyCheckpointStorage, storage)
	}
	retention, err := c.positiveDuration(keyJobRetention)
	if err != nil {
		return cluster.ControllerOptions{}, err
	}
	slotWait, err := c.positiveDuration(keySlotWait)
	if err != nil {
		return cluster.ControllerOptions{}, err
	}
	rescaleInterval, err := c.positiveDuration(keyRescaleInterval)
	if err != nil {
		return cluster.ControllerOptions{}, err
	}
	replicas, err := castInt(c.v.Get(keyControllerReplicas))
	if err != nil || replicas < 0 || replicas > 5 {
		return cluster.ControllerOptions{}, usagef("%s: want 0 (follow the NATS cluster) to 5, got %v", keyControllerReplicas, c.v.Get(keyControllerReplicas))
	}
	return cluster.ControllerOptions{Logger: c.log, HeartbeatInterval: hb, LostAfter: lost, MaxFailovers: fo, CheckpointStorage: storage,
		ID: c.v.GetString(keyControllerID), Bucket: c.v.GetString(keyControllerBucket), Replicas: replicas, JobRetention: retention,
		SlotWait: slotWait, RescaleInterval: rescaleInterval, Version: buildVersion()}, nil
}

func (c *cli) positiveDuration(key string) (time.Duration, error) {
	d, err := c.duration(key)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, usagef("%s: want a positive duration like 1s, got %v", key, c.v.Get(key))
	}
	return d, nil
}
