package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

func (c *cli) deployCommand() *cobra.Command {
	var f runFlags
	var t transformFlags
	var asJSON, wait bool
	cmd := &cobra.Command{
		Use:   "deploy JOB.yaml | MODULE.wasm",
		Short: "Submit a job to the controller and print its id",
		Long: `Submit a job to the controller (streamd server, or streamd controller with
hosts) and print its id.

The job file (or module) is checked first, like run does. Then every wasm module,
the input file of every file source, and the job file are uploaded to the NATS
JetStream object store STREAMD_ARTIFACTS (by content hash), so hosts need no
shared disk. Paths of file sinks name directories on the host that runs the job.

With a .wasm module the job is built like run builds it: one operator between
--source (file:PATH or generator:COUNT; a deployed job has no standard input) and
--sink (file:DIR, discard, or stdout: the host's standard output).

With --input the module runs as a transform, until it is stopped: it reads
nats:SUBJECT (the JetStream stream that captures it, else a stream
STREAMD_IN_<subject> created for it) or jetstream:STREAM[:FILTER], from --start
(first, new, seq:N or time:RFC3339) at its first start, and writes each record
exactly once to every --output nats:SUBJECT (the stream that captures it, which
must allow atomic publish and capture SUBJECT.streamd-commit.>, else a stream
STREAMD_OUT_<subject> created so). It checkpoints every --checkpoint-interval
into the JetStream object store, so stop, savepoint, cancel, failover and
deploy --from work as for a job file. deploy names the streams on stderr.

--on-error says what a record that makes the module fail does: fail (default:
the job restarts from its last checkpoint, and fails on that record again),
skip (the record is dropped and counted), or, for a transform,
dead_letter[:SUBJECT]: the record goes exactly once to SUBJECT (default
dead_letter.NAME, in the stream that captures it, else one created) as a JSON
object with the record and the error, as a job file's on_error dead_letter does
(docs/job-file.md, Dead letters).

--from PATH starts the job from a checkpoint or savepoint: a jetstream://BUCKET/...
location (from streamd stop or status of a job with checkpoint.storage jetstream)
or a directory as run --from takes it, which the hosts must see at the same path.
It is resolved and checked against the job here before the job is submitted.

--wait waits until the job ends; the exit status is then 0 only if it finished.`,
		Example: `  streamd deploy examples/wasm/wordcount/wordcount.yaml
  streamd deploy -p 4 job.yaml
  streamd deploy job.yaml --from jetstream://STREAMD_CHECKPOINTS/job-1a2b3c4d/savepoint-7-job-1a2b3c4d
  streamd deploy upper.wasm --source file:in.txt --sink file:out/
  streamd deploy upper.wasm --input nats:orders --output nats:orders.upper -p 2
  streamd deploy upper.wasm --input jetstream:ORDERS:orders.eu --output nats:eu.upper --start new
  streamd deploy parse.wasm --input nats:raw --output nats:parsed --on-error dead_letter:raw.bad
  id=$(streamd deploy job.yaml) && streamd status --json "$id"`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeJobFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			var job *jobfile.Job
			var file string
			var err error
			transform := t.input != "" && isModule(args[0])
			ts, err := c.checkTransform(cmd, f, t)
			if err != nil {
				return err
			}
			if err := checkOnError(t.onError, args[0], f, transform, ts); err != nil {
				return err
			}
			if !transform {
				if job, file, err = c.loadForDeploy(cmd, args[0], f, t.onError); err != nil {
					return err
				}
			}
			return c.withClient(cmd.Context(), func(ctx context.Context, cl *client.Client) error {
				if transform {
					if job, err = c.transformJob(ctx, cl, args[0], f, t, ts); err != nil {
						return err
					}
				}
				id, err := cl.DeployFrom(ctx, job, file, f.from)
				if err != nil {
					return err
				}
				if !wait {
					if asJSON {
						return c.printJSON(deployResult{ID: id, JobID: id})
					}
					fmt.Fprintln(c.stdout, id)
					return nil
				}
				// The id at once: on stderr with --json, so stdout stays one document.
				if asJSON {
					fmt.Fprintf(c.stderr, "job %s deployed; waiting for it to end (Ctrl-C detaches)\n", id)
				} else {
					fmt.Fprintln(c.stdout, id)
				}
				st, err := c.waitJob(cmd.Context(), cl, id)
				if err != nil {
					if cmd.Context().Err() != nil {
						fmt.Fprintf(c.stderr, "detached: job %s keeps running; cancel it with: streamd cancel %s\n", id, id)
						return nil
					}
					return err
				}
				if asJSON {
					if err := c.printJSON(st); err != nil {
						return err
					}
				}
				if st.State != wire.JobFinished {
					return fmt.Errorf("job %s %s: %s", id, st.State, st.Reason)
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.source, "source", "", "module only: where records come from: file:PATH (uploaded) or generator:COUNT")
	fl.StringVar(&f.sink, "sink", "stdout", "module only: where records go: stdout (the host's), file:DIR (on the host) or discard")
	fl.IntVarP(&f.parallelism, "parallelism", "p", 0, "job: replace the default parallelism; module: the operator's parallelism")
	fl.StringArrayVar(&f.config, "config", nil, "module only: operator config entry KEY=VALUE (repeatable)")
	fl.BoolVar(&f.allowClock, "allow-clock", false, "module only: give the guest the real wall clock")
	fl.BoolVar(&asJSON, "json", false, `print {"id": ...} (with --wait: the final status; the id goes to stderr at once)`)
	fl.BoolVar(&wait, "wait", false, "wait until the job ends; exit 0 only if it finished")
	fl.StringVar(&f.from, "from", "", "job or transform: start from a checkpoint or savepoint (a jetstream:// location, or a directory the hosts see)")
	fl.StringVar(&t.input, "input", "", "module: run it as a transform reading nats:SUBJECT (a stream that captures it, else one created) or jetstream:STREAM[:FILTER]")
	fl.StringArrayVar(&t.outputs, "output", nil, "transform: write exactly once to nats:SUBJECT (a stream that captures it, else one created; repeatable)")
	fl.StringVar(&t.start, "start", "", "transform: where the input starts at the first start: first (default), new, seq:N or time:RFC3339")
	fl.StringVar(&f.name, "name", "", "module: the job's name (default: the module's file name)")
	fl.DurationVar(&t.interval, "checkpoint-interval", time.Second, "transform: time between checkpoints (output is published when one completes)")
	fl.StringVar(&t.onError, "on-error", "fail", "module: a record that makes the guest fail: fail (the job restarts), skip (dropped), or, for a transform, dead_letter[:SUBJECT] (published exactly once to SUBJECT, default dead_letter.NAME)")
	dirFlags(cmd, "from")
	c.clientFlags(cmd, c.connectorFlags(cmd)...)
	return cmd
}

// loadForDeploy loads and checks the job like run does; it returns the job
// and the job file to upload ("" for a module).
func (c *cli) loadForDeploy(cmd *cobra.Command, target string, f runFlags, onError string) (*jobfile.Job, string, error) {
	if !isModule(target) {
		for _, name := range append([]string{"source", "sink", "config", "allow-clock", "input", "name", "on-error"}, transformOnly...) {
			if cmd.Flags().Changed(name) {
				return nil, "", usagef("--%s applies only when deploying a .wasm module; %s is a job file (set it in the file)", name, target)
			}
		}
		lo, err := c.loadOptions(f.parallelism)
		if err != nil {
			return nil, "", err
		}
		job, err := jobfile.LoadJob(target, lo)
		if err != nil {
			return nil, "", err
		}
		return job, job.Path, nil
	}
	if f.from != "" {
		return nil, "", usagef("--from applies to a job file or a transform (--input): a one-shot module has no checkpoints")
	}
	if f.source == "" || f.source == "stdin" {
		return nil, "", usagef("deploy %s: --source is required (file:PATH or generator:COUNT): a deployed job has no standard input; or run it as a transform with --input nats:SUBJECT", target)
	}
	filter, err := c.moduleFilter(target, f)
	if err != nil {
		return nil, "", err
	}
	if filter.OnError, err = parseOnError(onError, filterName(filter), false); err != nil {
		return nil, "", err
	}
	job, err := jobfile.FilterJob(filter)
	return job, "", err
}

// moduleFilter is the filter job of a module that runFlags describe.
func (c *cli) moduleFilter(module string, f runFlags) (jobfile.Filter, error) {
	cfg := map[string]string{}
	for _, kv := range f.config {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return jobfile.Filter{}, usagef("--config %q: want KEY=VALUE", kv)
		}
		cfg[k] = v
	}
	mrb, err := c.maxRecordBytes()
	if err != nil {
		return jobfile.Filter{}, err
	}
	return jobfile.Filter{Module: module, Source: f.source, Sink: f.sink, Name: f.name,
		Parallelism: f.parallelism, Config: cfg, AllowClock: f.allowClock, MaxRecordBytes: mrb}, nil
}

// deployResult is what deploy --json prints. JobID repeats ID under the key
// deploy printed before it matched status and list; it is deprecated.
type deployResult struct {
	ID    string `json:"id"`
	JobID string `json:"job_id"`
}

// waitJob polls the job's status until it ends (no request timeout applies),
// and logs on stderr each change of state or attempt, and the records counts
// every logEvery while they change.
func (c *cli) waitJob(ctx context.Context, cl *client.Client, id string) (*wire.JobStatus, error) {
	return c.waitStatus(ctx, cl, id, func(st *wire.JobStatus) bool { return wire.TerminalJobState(st.State) })
}

// waitStatus is waitJob until done holds for the job's status.
func (c *cli) waitStatus(ctx context.Context, cl *client.Client, id string, done func(*wire.JobStatus) bool) (*wire.JobStatus, error) {
	var last *wire.JobStatus
	var lastCounts string
	nextCounts := time.Now().Add(logEvery)
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err := cl.Status(rctx, id)
		cancel()
		if err != nil {
			return nil, err
		}
		if last == nil || st.State != last.State || st.Attempt != last.Attempt {
			line := fmt.Sprintf("job %s: %s, attempt %d", id, st.State, st.Attempt)
			if len(st.Hosts) > 0 {
				line += " on " + strings.Join(st.Hosts, ",")
			}
			if st.Reason != "" && !wire.TerminalJobState(st.State) {
				line += ": " + st.Reason // the end's reason is said once, by the error or the JSON
			}
			fmt.Fprintln(c.stderr, line)
		}
		last = st
		if done(st) {
			return st, nil
		}
		if counts := recordCounts(st); time.Now().After(nextCounts) {
			if counts != lastCounts && counts != "" {
				fmt.Fprintf(c.stderr, "job %s: %s\n", id, counts)
				lastCounts = counts
			}
			nextCounts = time.Now().Add(logEvery)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// recordCounts is "uid in=N out=M" for each operator of st.
func recordCounts(st *wire.JobStatus) string {
	var parts []string
	for _, op := range st.Operators {
		parts = append(parts, fmt.Sprintf("%s in=%d out=%d", op.UID, op.RecordsIn, op.RecordsOut))
	}
	return strings.Join(parts, ", ")
}
