package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
)

// Configuration keys of the cluster commands (docs/configuration.md).
const (
	keyNATSURL      = "nats.url"
	keyNATSUser     = "nats.user"
	keyNATSPassword = "nats.password"
	keyNATSToken    = "nats.token"
	keyNATSNKey     = "nats.nkey"
	keyNATSCreds    = "nats.creds"
	keyNATSTLSCA    = "nats.tls.ca"
	keyNATSTLSCert  = "nats.tls.cert"
	keyNATSTLSKey   = "nats.tls.key"

	keyHeartbeatInterval  = "cluster.heartbeat_interval"
	keyLostAfter          = "cluster.lost_after"
	keyMaxFailovers       = "cluster.max_failovers"
	keyRequestTimeout     = "cluster.request_timeout"
	keyCheckpointStorage  = "checkpoint.storage"
	keyControllerID       = "controller.id"
	keyControllerBucket   = "controller.bucket"
	keyControllerReplicas = "controller.replicas"
	keyJobRetention       = "controller.job_retention"
	keySlotWait           = "controller.slot_wait"
	keyRescaleInterval    = "controller.rescale_interval"

	keyHostID   = "host.id"
	keySlots    = "host.slots"
	keyDataDir  = "data_dir"
	keyNATSPort = "server.nats_port"
	keyNATSHost = "server.nats_host"
)

// DefaultNATSURL is where `streamd server` listens by default.
const defaultNATSURL = "nats://127.0.0.1:4222"

var clusterKeys = []string{keyNATSURL, keyNATSUser, keyNATSPassword, keyNATSToken, keyNATSNKey, keyNATSCreds,
	keyNATSTLSCA, keyNATSTLSCert, keyNATSTLSKey, keyHeartbeatInterval, keyLostAfter, keyMaxFailovers,
	keyRequestTimeout, keyCheckpointStorage, keyControllerID, keyControllerBucket, keyControllerReplicas, keyJobRetention, keySlotWait, keyRescaleInterval, keyHostID, keySlots, keyDataDir, keyNATSPort, keyNATSHost}

func init() { knownKeys = append(knownKeys, clusterKeys...) }

// clusterCommands are the commands of the control plane.
func (c *cli) clusterCommands() []*cobra.Command {
	return []*cobra.Command{c.serverCommand(), c.controllerCommand(), c.hostCommand(), c.deployCommand(),
		c.listCommand(), c.statusCommand(), c.cancelCommand(), c.deleteCommand(), c.savepointCommand(), c.stopCommand(), c.upgradeCommand(), c.hostsCommand(), c.logsCommand()}
}

// flagKey is a flag and the configuration key it sets.
type flagKey struct{ flag, key string }

// natsFlags adds the NATS connection flags to cmd; withFlags binds them (and
// extra) when cmd runs, so several commands can have a flag of the same key.
func (c *cli) natsFlags(cmd *cobra.Command, extra ...flagKey) {
	fl := cmd.Flags()
	fl.String("nats", defaultNATSURL, "NATS server URL(s), comma-separated ("+keyNATSURL+")")
	fl.String("nats-user", "", "NATS user, with --nats-password ("+keyNATSUser+")")
	fl.String("nats-password", "", "NATS password ("+keyNATSPassword+")")
	fl.String("nats-token", "", "NATS token ("+keyNATSToken+")")
	fl.String("nats-nkey", "", "file holding a NATS user nkey seed ("+keyNATSNKey+")")
	fl.String("nats-creds", "", "NATS .creds file (user JWT and nkey seed) ("+keyNATSCreds+")")
	fl.String("nats-tls-ca", "", "PEM file of CAs to verify the NATS server with ("+keyNATSTLSCA+")")
	fl.String("nats-tls-cert", "", "client certificate for NATS mutual TLS ("+keyNATSTLSCert+")")
	fl.String("nats-tls-key", "", "client key for NATS mutual TLS ("+keyNATSTLSKey+")")
	binds := append([]flagKey{{"nats", keyNATSURL}, {"nats-user", keyNATSUser}, {"nats-password", keyNATSPassword},
		{"nats-token", keyNATSToken}, {"nats-nkey", keyNATSNKey}, {"nats-creds", keyNATSCreds},
		{"nats-tls-ca", keyNATSTLSCA}, {"nats-tls-cert", keyNATSTLSCert}, {"nats-tls-key", keyNATSTLSKey}}, extra...)
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		c.clusterDefaults()
		for _, b := range binds {
			c.bind(cmd.Flags(), b.key, b.flag)
		}
		return nil
	}
}

// clusterDefaults sets the defaults of the cluster keys (which also makes
// their STREAMD_ variables known to viper).
func (c *cli) clusterDefaults() {
	v := c.v
	v.SetDefault(keyNATSURL, defaultNATSURL)
	for _, k := range []string{keyNATSUser, keyNATSPassword, keyNATSToken, keyNATSNKey, keyNATSCreds, keyNATSTLSCA, keyNATSTLSCert, keyNATSTLSKey, keyHostID, keyDataDir, keyCheckpointStorage, keyControllerID} {
		v.SetDefault(k, "")
	}
	v.SetDefault(keyControllerBucket, cluster.DefaultControllerBucket)
	v.SetDefault(keyControllerReplicas, 0)
	v.SetDefault(keyHeartbeatInterval, "1s")
	v.SetDefault(keyLostAfter, cluster.DefaultLostAfter)
	v.SetDefault(keyMaxFailovers, cluster.DefaultMaxFailovers)
	v.SetDefault(keyRequestTimeout, "30s")
	v.SetDefault(keySlots, goruntime.NumCPU())
	v.SetDefault(keyNATSPort, 4222)
	v.SetDefault(keyNATSHost, "127.0.0.1")
}

// natsOptions builds the connection options from the nats.* keys.
func (c *cli) natsOptions(name string) (natsutil.ConnectOptions, error) {
	v := c.v
	o := natsutil.ConnectOptions{
		User: v.GetString(keyNATSUser), Password: v.GetString(keyNATSPassword), Token: v.GetString(keyNATSToken),
		NKeySeedFile: v.GetString(keyNATSNKey), CredsFile: v.GetString(keyNATSCreds),
		TLSCAFile: v.GetString(keyNATSTLSCA), TLSCertFile: v.GetString(keyNATSTLSCert), TLSKeyFile: v.GetString(keyNATSTLSKey),
		Name: name,
	}
	for _, u := range strings.Split(v.GetString(keyNATSURL), ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.URLs = append(o.URLs, u)
		}
	}
	if err := o.Validate(); err != nil {
		return o, usagef("NATS configuration (nats.*): %w", err)
	}
	return o, nil
}

// connectNATS connects with the nats.* settings and explains failures.
func (c *cli) connectNATS(name string, extra ...nats.Option) (*nats.Conn, error) {
	o, err := c.natsOptions(name)
	if err != nil {
		return nil, err
	}
	nc, err := o.Connect(extra...)
	if err != nil {
		low := strings.ToLower(err.Error())
		switch {
		case strings.Contains(low, "authorization violation") || strings.Contains(low, "authentication"):
			return nil, fmt.Errorf("NATS server %s refused the credentials (%s): %w", o.URL(), credentialsUsed(o), err)
		case errors.Is(err, nats.ErrNoServers) || strings.Contains(low, "connection refused"):
			return nil, fmt.Errorf("no NATS server at %s (start `streamd server`, or set --nats / STREAMD_NATS_URL / %s): %w", o.URL(), keyNATSURL, err)
		}
		return nil, err
	}
	return nc, nil
}

func credentialsUsed(o natsutil.ConnectOptions) string {
	switch {
	case o.User != "":
		return fmt.Sprintf("user %q and a password, from %s/%s", o.User, keyNATSUser, keyNATSPassword)
	case o.Token != "":
		return "a token, from " + keyNATSToken
	case o.NKeySeedFile != "":
		return "the nkey seed " + o.NKeySeedFile
	case o.CredsFile != "":
		return "the creds file " + o.CredsFile
	}
	return "no credentials; set nats.user and nats.password, nats.token, nats.nkey or nats.creds"
}

// savepointRequestTimeout is the least time stop, savepoint and upgrade
// wait for the controller's answer, which comes once the savepoint is
// written (the default checkpoint timeout): on a loaded cluster that takes
// longer than the request timeout of other commands.
const savepointRequestTimeout = 10 * time.Minute

// withSavepointClient is withClient for a request answered after a
// savepoint: its timeout is at least savepointRequestTimeout.
func (c *cli) withSavepointClient(ctx context.Context, fn func(ctx context.Context, cl *client.Client) error) error {
	return c.withClientTimeout(ctx, savepointRequestTimeout, fn)
}

// withClient connects and runs fn with a control API client.
func (c *cli) withClient(ctx context.Context, fn func(ctx context.Context, cl *client.Client) error) error {
	return c.withClientTimeout(ctx, 0, fn)
}

// withClientTimeout is withClient with a timeout of at least least.
func (c *cli) withClientTimeout(ctx context.Context, least time.Duration, fn func(ctx context.Context, cl *client.Client) error) error {
	nc, err := c.connectNATS("streamd cli")
	if err != nil {
		return err
	}
	defer nc.Close()
	cl, err := client.NewClient(nc)
	if err != nil {
		return err
	}
	cl.Log = c.log
	timeout, err := c.duration(keyRequestTimeout)
	if err != nil {
		return err
	}
	if timeout > 0 && timeout < least {
		timeout = least
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return fn(ctx, cl)
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cli) listCommand() *cobra.Command {
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the jobs the controller knows, newest first (those finished, failed or canceled longer ago than controller.job_retention only with --all)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.withClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				jobs, err := cl.List(ctx, all)
				if err != nil {
					return err
				}
				if asJSON {
					return c.printJSON(jobs)
				}
				tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "JOB\tNAME\tSTATE\tATTEMPT\tHOSTS\tCREATED")
				for _, j := range jobs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", j.ID, j.Name, j.State, j.Attempt, orDash(strings.Join(j.Hosts, ",")), j.Created.Local().Format(time.DateTime))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if len(jobs) > 0 && jobs[0].Leader != "" {
					fmt.Fprintf(c.stdout, "controller %s leads (term %d)\n", jobs[0].Leader, jobs[0].Term)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (a list of job statuses)")
	cmd.Flags().BoolVar(&all, "all", false, "list the jobs that ended longer ago than the job retention too")
	c.clientFlags(cmd)
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (c *cli) statusCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "status JOB",
		ValidArgsFunction: c.completeJobID,
		Short:             "Show a job's state, attempts, its subtasks with their hosts and states, and its last checkpoints",
		Args:              exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				st, err := cl.Status(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return c.printJSON(st)
				}
				c.printStatus(st)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	c.clientFlags(cmd)
	return cmd
}

// clientFlags adds the NATS flags and --request-timeout (and binds extra).
func (c *cli) clientFlags(cmd *cobra.Command, extra ...flagKey) {
	c.natsFlags(cmd, append([]flagKey{{"request-timeout", keyRequestTimeout}}, extra...)...)
	cmd.Flags().Duration("request-timeout", 30*time.Second, "how long to wait for the controller ("+keyRequestTimeout+"; stop, savepoint and upgrade wait at least 10m: they are answered once the savepoint is written)")
}

func (c *cli) printStatus(st *wire.JobStatus) {
	w := c.stdout
	fmt.Fprintf(w, "job %s (%s): %s, attempt %d, %d slot(s) on %s\n", st.ID, st.Name, st.State, st.Attempt, st.Slots, orDash(strings.Join(st.Hosts, ",")))
	if st.Reason != "" {
		fmt.Fprintf(w, "reason: %s\n", st.Reason)
	}
	if st.DeclaredParallelism > 0 {
		fmt.Fprintf(w, "parallelism: %d (declared %d, min %d)\n", st.Parallelism, st.DeclaredParallelism, st.MinParallelism)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  OPERATOR\tPARALLELISM\tRECORDS IN\tRECORDS OUT\tSUBTASKS")
	for _, op := range st.Operators {
		var subs []string
		for _, s := range op.Subtasks {
			sub := fmt.Sprintf("%d:%s@%s", s.Index, s.State, orDash(s.Host))
			if s.Live != nil && s.Live.HasSourceLag {
				sub += fmt.Sprintf(" (lag %d)", s.Live.SourceLag) // a source's records behind the end of its input
			}
			subs = append(subs, sub)
		}
		par := fmt.Sprint(op.Parallelism)
		if op.DeclaredParallelism != 0 && op.DeclaredParallelism != op.Parallelism {
			par += fmt.Sprintf(" of %d", op.DeclaredParallelism)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", op.UID, par, op.RecordsIn, op.RecordsOut, strings.Join(subs, " "))
	}
	tw.Flush()
	for _, op := range st.Operators {
		if op.UnionDeclines > 0 {
			fmt.Fprintf(w, "operator %s: %d checkpoint(s) declined: it has union list state and was partially finished\n", op.UID, op.UnionDeclines)
		}
	}
	if st.CheckpointMode != "" {
		fmt.Fprintf(w, "checkpoints: %s\n", st.CheckpointMode)
	}
	if n := len(st.Checkpoints); n > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CHECKPOINT\tKIND\tCOMPLETED\tDURATION\tSIZE\tIN-FLIGHT")
		for i := n - 1; i >= 0 && i >= n-5; i-- { // the last five, newest first
			cp := st.Checkpoints[i]
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", cp.ID, cp.Kind, cp.Time.Local().Format("15:04:05.000"),
				cp.Duration.Round(time.Millisecond), byteSize(cp.Size), byteSize(cp.InFlight))
		}
		tw.Flush()
	}
	c.printVersions(st)
	for _, r := range st.Rescales {
		line := fmt.Sprintf("rescaled %s: parallelism %d -> %d from attempt %d: %s", r.Time.Local().Format("15:04:05"), r.From, r.To, r.Attempt, r.Reason)
		if r.Restore != "" {
			line += " (from savepoint " + r.Restore + ")"
		}
		fmt.Fprintln(w, line)
	}
	if a := st.Autoscaler; a != nil {
		fmt.Fprintf(w, "autoscaler: %s\n", a.Settings)
		if a.Hold != "" {
			fmt.Fprintf(w, "autoscaler holds: %s\n", a.Hold)
		}
		for _, d := range a.Decisions {
			fmt.Fprintf(w, "autoscaled %s: operator %s %d -> %d (%s): %s\n", d.Time.Local().Format("15:04:05"), d.Operator, d.From, d.To, d.Outcome, d.Reason)
		}
	}
	for _, a := range st.Attempts {
		line := fmt.Sprintf("attempt %d on %s: %s", a.Attempt, orDash(strings.Join(a.Hosts, ",")), a.State)
		if a.Reason != "" {
			line += ": " + a.Reason
		}
		fmt.Fprintln(w, line)
	}
	if st.Leader != "" {
		fmt.Fprintf(w, "controller %s leads (term %d)\n", st.Leader, st.Term)
	}
}

// byteSize is n in B, KiB, MiB or GiB.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (c *cli) deleteCommand() *cobra.Command {
	var asJSON, checkpoints bool
	cmd := &cobra.Command{
		Use:               "delete JOB",
		ValidArgsFunction: c.completeJobID,
		Short:             "Remove the record of an ended job (finished, failed, canceled or stopped); with --checkpoints its checkpoints too",
		Args:              exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				st, err := cl.Delete(ctx, args[0], checkpoints)
				if err != nil {
					return err
				}
				if asJSON {
					return c.printJSON(st)
				}
				what := ""
				if checkpoints {
					what = " and its checkpoints"
				}
				fmt.Fprintf(c.stdout, "job %s (%s) deleted%s\n", st.ID, st.State, what)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&checkpoints, "checkpoints", false, "also remove the job's checkpoints and the savepoints beside them (its directory DIR/JOB, or its prefix in the JetStream object store)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the deleted job's last status as JSON")
	c.clientFlags(cmd)
	return cmd
}

func (c *cli) cancelCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "cancel JOB",
		ValidArgsFunction: c.completeJobID,
		Short:             "Cancel a job: its subtasks stop at once, without a savepoint",
		Args:              exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				st, err := cl.Cancel(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return c.printJSON(st)
				}
				fmt.Fprintf(c.stdout, "job %s %s\n", st.ID, st.State)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the job's status as JSON")
	c.clientFlags(cmd)
	return cmd
}

func (c *cli) savepointCommand() *cobra.Command {
	var asJSON bool
	var dir string
	cmd := &cobra.Command{
		Use:               "savepoint JOB",
		ValidArgsFunction: c.completeJobID,
		Short:             "Take a savepoint of a running job",
		Args:              exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("dir") {
				fmt.Fprintln(c.stderr, "streamd: --dir is deprecated; use --savepoint-dir")
			}
			return c.withSavepointClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				path, err := cl.Savepoint(ctx, args[0], absIfSet(dir))
				if err != nil {
					return err
				}
				return c.printPath(asJSON, path)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"path": ...}`)
	savepointDirFlag(cmd, &dir)
	// --dir was the flag's name before it matched stop's; it still works.
	cmd.Flags().StringVar(&dir, "dir", "", "")
	if err := cmd.Flags().MarkHidden("dir"); err != nil {
		panic(err) // a programming error: the flag does not exist
	}
	dirFlags(cmd, "dir")
	c.clientFlags(cmd)
	return cmd
}

func (c *cli) stopCommand() *cobra.Command {
	var asJSON, drain bool
	var dir string
	cmd := &cobra.Command{
		Use:               "stop JOB",
		ValidArgsFunction: c.completeJobID,
		Short:             "Stop a job with a savepoint (--drain: finish its input first)",
		Args:              exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withSavepointClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				path, err := cl.Stop(ctx, args[0], absIfSet(dir), drain)
				if err != nil {
					return err
				}
				return c.printPath(asJSON, path)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"path": ...}`)
	savepointDirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&drain, "drain", false, "end the input and finish the operators (event-time timers fire) before the savepoint")
	c.clientFlags(cmd)
	return cmd
}

// savepointDirFlag adds --savepoint-dir, the flag of savepoint and stop.
func savepointDirFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "savepoint-dir", "", "directory of the savepoint, on the host (default: the job's checkpoint directory)")
	dirFlags(cmd, "savepoint-dir")
}

func absIfSet(dir string) string {
	if dir == "" {
		return ""
	}
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

func (c *cli) printPath(asJSON bool, path string) error {
	if asJSON {
		return c.printJSON(map[string]string{"path": path})
	}
	fmt.Fprintln(c.stdout, path)
	return nil
}

func (c *cli) hostsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "hosts",
		Short: "List the hosts registered with the controller",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.withClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				hs, err := cl.Hosts(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return c.printJSON(hs)
				}
				tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "HOST\tSTATE\tSLOTS\tFREE\tLAST SEEN")
				for _, h := range hs {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", h.ID, h.State, h.Slots, h.Free, h.LastSeen.Local().Format(time.DateTime))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.clientFlags(cmd)
	return cmd
}

// dataDir is data_dir, default <user cache dir>/streamd.
func (c *cli) dataDir() (string, error) {
	dir := c.v.GetString(keyDataDir)
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", usagef("%s: no default (%v); set --data-dir", keyDataDir, err)
		}
		dir = filepath.Join(base, "streamd")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", usagef("%s: %w", keyDataDir, err)
	}
	return abs, nil
}
