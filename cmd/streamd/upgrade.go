package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

func (c *cli) upgradeCommand() *cobra.Command {
	var asJSON bool
	var operator string
	var timeout time.Duration
	var parallelism int
	cmd := &cobra.Command{
		Use:   "upgrade JOB NEW.wasm | JOB.yaml",
		Short: "Upgrade a running job through a savepoint to a new module or job file; roll back if it does not start",
		Long: `Upgrade a running job to a new version through a savepoint, under the same job id.
A job that does not run (it restarts, say on a record its module fails on, or
waits for slots) cannot take a savepoint: its attempt is canceled and the new
version starts from the job's latest checkpoint, or from nothing if it has none;
upgrade says which.

The new version is checked first, before anything stops: the module (or every
module of the job file) is compiled and its exports and ABI version checked, as
validate does, and the controller checks that it can restore the state of the
job's latest checkpoint (operator uids, parallelism, as deploy --from checks).
Then the controller stops the job with a savepoint (as stop does), checks the
savepoint the same way, and starts the new version from it. The job keeps its id,
so status, logs and metrics go on, and so do its checkpoint ids and the writer
names of its exactly-once sinks.

With a .wasm module, the job stays as it runs (its inputs, outputs, parallelism,
name, operator uids and config: a transform deployed with --input/--output stays
that transform) and only the module of its wasm operator is replaced (--operator
names it when the job has several). With a job file, the job file is the new
version.

If the new version fails to start or restore within its restart strategy, fails
in open twice in a row with the same error (a module that does so fails every
time: no need to wait), or does not run within --timeout, the controller starts the version before it again from
the same savepoint and upgrade says so and exits 1. The controller does this
whether upgrade still waits or not (Ctrl-C detaches). status shows every
version: its modules' digests (or the job file's), when it started, from which
savepoint, and how it went.`,
		Example: `  streamd upgrade counter-1a2b3c4d counter-v2.wasm
  streamd upgrade pipeline-5e6f7a8b pipeline-v2.yaml --timeout 5m
  streamd upgrade --operator enrich pipeline-5e6f7a8b enrich-v3.wasm`,
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeUpgrade,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, target := args[0], args[1]
			if timeout <= 0 {
				return usagef("--timeout must be positive, got %v", timeout)
			}
			var job *jobfile.Job
			var file, module string
			ctx := cmd.Context()
			if isModule(target) {
				if cmd.Flags().Changed("parallelism") {
					return usagef("--parallelism applies to a job file; a module upgrade keeps the job's parallelism")
				}
				module = target
				if err := c.loadModules(ctx, namedModule{what: "module " + target, path: target}); err != nil {
					return err
				}
			} else {
				if operator != "" {
					return usagef("--operator names the operator whose module a .wasm replaces; %s is a job file, which replaces the whole job", target)
				}
				lo, err := c.loadOptions(parallelism)
				if err != nil {
					return err
				}
				if job, err = jobfile.LoadJob(target, lo); err != nil {
					return err
				}
				if err := c.checkModules(ctx, job); err != nil {
					return err
				}
				file = job.Path
			}
			return c.withSavepointClient(ctx, func(rctx context.Context, cl *client.Client) error {
				rep, err := cl.Upgrade(rctx, id, job, file, module, operator, timeout)
				if err != nil {
					if ctx.Err() != nil {
						fmt.Fprintf(c.stderr, "interrupted: if the controller took the upgrade request, it goes on with it; streamd status %s shows it\n", id)
					}
					return err
				}
				if rep.Replaced {
					fmt.Fprintf(c.stderr, "job %s did not run (it restarted or waited for slots): its attempt was canceled; starting version %d %s (Ctrl-C detaches; the controller finishes the upgrade)\n",
						id, rep.Version, wire.StartsFrom(rep.Savepoint))
				} else {
					fmt.Fprintf(c.stderr, "job %s stopped with savepoint %s; starting version %d (Ctrl-C detaches; the controller finishes the upgrade)\n", id, rep.Savepoint, rep.Version)
				}
				st, err := c.waitStatus(ctx, cl, id, func(st *wire.JobStatus) bool { return upgradeDecided(st, rep.Version) })
				if err != nil {
					if ctx.Err() != nil {
						fmt.Fprintf(c.stderr, "detached: the controller finishes the upgrade of job %s to version %d; streamd status %s shows how it went\n", id, rep.Version, id)
						return nil
					}
					return err
				}
				res, err := upgradeOutcome(st, rep)
				if asJSON {
					if jerr := c.printJSON(res); jerr != nil {
						return jerr
					}
				} else if err == nil {
					fmt.Fprintf(c.stdout, "job %s upgraded to version %d (%s)\n", id, rep.Version, wire.StartsFrom(rep.Savepoint))
				}
				return err
			})
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, `print {"id", "version", "savepoint", "state", "reason", "versions"} (also when it was rolled back)`)
	fl.StringVar(&operator, "operator", "", "module: the uid of the wasm operator whose module it replaces (default: the job's only one)")
	fl.DurationVar(&timeout, "timeout", wire.DefaultUpgradeStartTimeout, "how long the new version may take to run before it counts as failed and is rolled back (a rollback has at least 2m)")
	fl.IntVarP(&parallelism, "parallelism", "p", 0, "job file: replace its default parallelism")
	c.clientFlags(cmd)
	return cmd
}

// completeUpgrade completes JOB with the job ids, then the new version's file.
func (c *cli) completeUpgrade(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) == 0 {
		return c.completeJobID(cmd, args, toComplete)
	}
	return completeJobFile(cmd, args[1:], toComplete)
}

// upgradeDecided reports whether version n of the job, started by an
// upgrade, runs or ended, and, if it was rolled back, so did the rollback.
func upgradeDecided(st *wire.JobStatus, n int) bool {
	if len(st.Versions) < n {
		return wire.TerminalJobState(st.State) // no history: nothing to wait for
	}
	switch st.Versions[n-1].State {
	case wire.VersionStarting:
		return false
	case wire.VersionRolledBack:
		last := st.Versions[len(st.Versions)-1]
		return last.Version > n && last.State != wire.VersionStarting
	}
	return true
}

// upgradeResult is what upgrade --json prints.
type upgradeResult struct {
	ID        string               `json:"id"`
	Version   int                  `json:"version"`
	Savepoint string               `json:"savepoint"`
	State     string               `json:"state"` // the version's: running, rolled back, or the job's end
	Reason    string               `json:"reason,omitempty"`
	Versions  []wire.VersionStatus `json:"versions"`
}

// upgradeOutcome is the result of the upgrade rep started, as st shows it,
// and an error unless the new version runs.
func upgradeOutcome(st *wire.JobStatus, rep wire.UpgradeReply) (upgradeResult, error) {
	res := upgradeResult{ID: st.ID, Version: rep.Version, Savepoint: rep.Savepoint, State: st.State, Reason: st.Reason, Versions: st.Versions}
	if len(st.Versions) < rep.Version {
		return res, fmt.Errorf("job %s %s: %s", st.ID, st.State, st.Reason)
	}
	v := st.Versions[rep.Version-1]
	res.State, res.Reason = v.State, v.Reason
	switch v.State {
	case wire.VersionRunning:
		return res, nil
	case wire.VersionRolledBack:
		back := st.Versions[len(st.Versions)-1]
		if back.State == wire.VersionRunning {
			return res, fmt.Errorf("job %s: version %d failed: %s; rolled back: version %d runs again (as version %d) %s",
				st.ID, v.Version, v.Reason, back.Rerun, back.Version, wire.StartsFrom(rep.Savepoint))
		}
		return res, fmt.Errorf("job %s: version %d failed: %s; the rollback to version %d %s did not run either (%s: %s); the job is %s%s",
			st.ID, v.Version, v.Reason, back.Rerun, wire.StartsFrom(rep.Savepoint), back.State, back.Reason, st.State, deployFromHint(rep.Savepoint))
	}
	return res, fmt.Errorf("job %s: version %d %s before it ran: %s", st.ID, v.Version, v.State, v.Reason)
}

func deployFromHint(location string) string {
	if location == "" {
		return ""
	}
	return " (streamd deploy --from " + location + " starts it)"
}

// printVersions writes a job's version history (status): a table, then
// why versions were rolled back or failed (a reason may span lines).
func (c *cli) printVersions(st *wire.JobStatus) {
	if len(st.Versions) == 0 {
		return
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  VERSION\tSTARTED\tATTEMPT\tMODULES\tFROM\tSTATE")
	for _, v := range st.Versions {
		var mods []string
		for _, m := range v.Modules {
			mods = append(mods, m.Operator+"="+shortDigest(m.Digest))
		}
		if v.JobFile != "" {
			mods = append(mods, "job file "+shortDigest(v.JobFile))
		}
		state := v.State
		if v.Rerun != 0 {
			state += fmt.Sprintf(" (version %d again)", v.Rerun)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\t%s\t%s\n", v.Version, v.Started.Local().Format(time.DateTime), v.Attempt,
			orDash(strings.Join(mods, " ")), orDash(v.From), state)
	}
	tw.Flush()
	for _, v := range st.Versions {
		if v.Reason != "" {
			fmt.Fprintf(c.stdout, "version %d %s: %s\n", v.Version, v.State, v.Reason)
		}
	}
}

// shortDigest is "sha256:" and the first 12 hex digits of digest.
func shortDigest(digest string) string {
	algo, hex, ok := strings.Cut(digest, ":")
	if !ok || len(hex) <= 12 {
		return digest
	}
	return algo + ":" + hex[:12]
}
