package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
)

// The retention of the job log stream, used by the host that creates it.
const (
	keyLogsMaxAge   = "logs.max_age"
	keyLogsMaxBytes = "logs.max_bytes"
)

func init() { knownKeys = append(knownKeys, keyLogsMaxAge, keyLogsMaxBytes) }

// logStreamConfig is the retention of the job log stream (logs.max_age,
// logs.max_bytes; unset: the defaults).
func (c *cli) logStreamConfig() (wire.LogStreamConfig, error) {
	var cfg wire.LogStreamConfig
	for _, k := range []string{keyLogsMaxAge, keyLogsMaxBytes} {
		_ = c.v.BindEnv(k)
	}
	if c.v.IsSet(keyLogsMaxAge) {
		d, err := c.positiveDuration(keyLogsMaxAge)
		if err != nil {
			return cfg, err
		}
		cfg.MaxAge = d
	}
	if c.v.IsSet(keyLogsMaxBytes) {
		n, err := c.positiveInt(keyLogsMaxBytes)
		if err != nil {
			return cfg, err
		}
		cfg.MaxBytes = int64(n)
	}
	return cfg, nil
}

func (c *cli) logsCommand() *cobra.Command {
	var (
		follow, asJSON bool
		operator       string
		subtask        int
		since          time.Duration
	)
	cmd := &cobra.Command{
		Use:               "logs JOB",
		ValidArgsFunction: c.completeJobID,
		Short:             "Print a job's guest and task log lines, published by the hosts (-f: follow them)",
		Long: `Print the log lines of a deployed job: what its modules write to stdout and
stderr and log, and the runtime's lines about its subtasks, as the hosts running
them publish them to the JetStream stream ` + wire.LogStream + ` (kept for
logs.max_age, at most logs.max_bytes; docs/subjects.md). Without -f it prints
the lines stored so far and exits; with -f it goes on printing new lines until
interrupted.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if subtask < -1 {
				return usagef("--subtask %d: want a subtask index (0 or more)", subtask)
			}
			if operator != "" && strings.ContainsAny(operator, ".*> \t") {
				return usagef("--operator %q: not an operator uid", operator)
			}
			if since < 0 {
				return usagef("--since %s: want a positive duration like 10m", since)
			}
			return c.printLogs(cmd.Context(), args[0], operator, subtask, since, follow, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "go on printing new lines until interrupted")
	fl.StringVar(&operator, "operator", "", "only the lines of the operator with this uid")
	fl.IntVar(&subtask, "subtask", -1, "only the lines of this subtask")
	fl.DurationVar(&since, "since", 0, "only the lines of the last DUR (like 10m; default: all that are kept)")
	fl.BoolVar(&asJSON, "json", false, "print each line as its JSON record")
	c.clientFlags(cmd)
	return cmd
}

func (c *cli) printLogs(ctx context.Context, id, operator string, subtask int, since time.Duration, follow, asJSON bool) error {
	// The job and the stream are looked up within --request-timeout; the
	// lines are read until ctx ends.
	return c.withClient(ctx, func(rctx context.Context, cl *client.Client) error {
		if _, err := cl.Status(rctx, id); err != nil {
			return err
		}
		js, err := jetstream.New(cl.Conn())
		if err != nil {
			return err
		}
		stream, err := js.Stream(rctx, wire.LogStream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("job %s: no log stream %s on the NATS server (the hosts create it when they start; are they older than `streamd logs`?)", id, wire.LogStream)
		}
		if err != nil {
			return fmt.Errorf("job %s: log stream %s: %w", id, wire.LogStream, err)
		}
		return c.readLogs(ctx, rctx, stream, id, operator, subtask, since, follow, asJSON)
	})
}

// readLogs prints the job's lines of stream; rctx bounds the requests, ctx
// the reading.
func (c *cli) readLogs(ctx, rctx context.Context, stream jetstream.Stream, id, operator string, subtask int, since time.Duration, follow, asJSON bool) error {
	opTok, subTok := "*", "*"
	if operator != "" {
		opTok = operator
	}
	if subtask >= 0 {
		subTok = strconv.Itoa(subtask)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.SubjectLogsPrefix + id + "." + opTok + "." + subTok}}
	if since > 0 {
		t := time.Now().Add(-since)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cons, err := stream.OrderedConsumer(rctx, cfg)
	if err != nil {
		return fmt.Errorf("job %s: read log stream %s: %w", id, wire.LogStream, err)
	}
	if !follow {
		info, err := cons.Info(rctx)
		if err != nil {
			return fmt.Errorf("job %s: read log stream %s: %w", id, wire.LogStream, err)
		}
		if info.NumPending == 0 {
			return nil
		}
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("job %s: read log stream %s: %w", id, wire.LogStream, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: the end of -f
			}
			return fmt.Errorf("job %s: read log stream %s: %w", id, wire.LogStream, err)
		}
		if asJSON {
			fmt.Fprintf(c.stdout, "%s\n", msg.Data())
		} else {
			printLogLine(c.stdout, msg.Data())
		}
		if !follow {
			if md, err := msg.Metadata(); err == nil && md.NumPending == 0 {
				return nil
			}
		}
	}
}

// printLogLine prints a LogRecord as
// "12:00:01.234 upper[1]@h2 attempt 0 INFO guest: hello".
func printLogLine(w io.Writer, data []byte) {
	var r wire.LogRecord
	if err := json.Unmarshal(data, &r); err != nil {
		fmt.Fprintf(w, "(not a log record: %q)\n", data)
		return
	}
	where := "job"
	if r.Operator != "" && r.Subtask != nil {
		where = fmt.Sprintf("%s[%d]", r.Operator, *r.Subtask)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s@%s attempt %d %s ", r.Time.Local().Format("15:04:05.000"), where, r.Host, r.Attempt, r.Level)
	if r.Source == "guest" {
		// The guest's own words only (a log call's phase stays in --json).
		b.WriteString("guest: " + r.Msg)
		fmt.Fprintln(w, b.String())
		return
	}
	b.WriteString(r.Msg)
	for _, k := range slices.Sorted(maps.Keys(r.Attrs)) {
		v := r.Attrs[k]
		if strings.ContainsAny(v, " \"=") || v == "" {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	fmt.Fprintln(w, b.String())
}
