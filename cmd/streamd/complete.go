package main

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
)

// Shell completion (docs/cli.md, "Shell completion"): cobra's completion
// command writes the scripts; the scripts call the hidden __complete
// command, which asks the functions here.

// completionTimeout bounds the controller request of a job-id completion,
// connecting included: a shell waits for it at every TAB.
const completionTimeout = time.Second

// jobFileExts are the files run, deploy and validate take.
var jobFileExts = []string{"yaml", "yml", "wasm"}

// completeJobFile completes the one JOB.yaml | MODULE.wasm argument.
func completeJobFile(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return jobFileExts, cobra.ShellCompDirectiveFilterFileExt
}

// completeDir completes the one PATH argument with directories.
func completeDir(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveFilterDirs
}

// completeDirFlag completes a flag's value with directories.
func completeDirFlag(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

// dirFlags has the named flags of cmd complete directories.
func dirFlags(cmd *cobra.Command, names ...string) {
	for _, name := range names {
		if err := cmd.RegisterFlagCompletionFunc(name, completeDirFlag); err != nil {
			panic(err) // a programming error: the flag does not exist
		}
	}
}

// completeJobID completes the one JOB argument with the ids of the jobs the
// controller lists, each described by the job's name and state. It uses
// the command's NATS settings; on any error (no NATS server, no controller
// within completionTimeout, bad settings) it offers nothing and says
// nothing: a shell shows no error at a TAB.
func (c *cli) completeJobID(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	jobs, err := c.completionJobs(cmd, args)
	if err != nil {
		cobra.CompDebugln("streamd: job ids: "+err.Error(), false) // only with BASH_COMP_DEBUG_FILE set
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, j := range jobs {
		if strings.HasPrefix(j.ID, toComplete) {
			out = append(out, cobra.CompletionWithDesc(j.ID, j.Name+", "+j.State))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completionJobs lists the jobs within completionTimeout.
func (c *cli) completionJobs(cmd *cobra.Command, args []string) ([]wire.JobStatus, error) {
	// __complete skips the root's PersistentPreRunE, which loads the
	// configuration, and cmd's PreRunE, which binds its NATS flags.
	if err := c.loadConfig(); err != nil {
		return nil, err
	}
	if cmd.PreRunE != nil {
		if err := cmd.PreRunE(cmd, args); err != nil {
			return nil, err
		}
	}
	o, err := c.natsOptions("streamd completion")
	if err != nil {
		return nil, err
	}
	nc, err := o.Connect(nats.Timeout(completionTimeout), nats.NoReconnect())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	cl, err := client.NewClient(nc)
	if err != nil {
		return nil, err
	}
	cl.LeaderWait = completionTimeout
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	return cl.List(ctx, false)
}
