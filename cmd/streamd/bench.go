package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/nexmark"
)

func (c *cli) benchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run standard benchmarks (nexmark) and print their throughput per core",
	}
	var (
		events, backends, dir string
	)
	nx := &cobra.Command{
		Use:   "nexmark QUERIES",
		Short: "Run Nexmark queries (q0,q5,...) and print events/s, CPU seconds and events/s per core beside Flink's",
		Long: `Run each Nexmark query's job file of examples/nexmark (docs/nexmark.md) with
streamd run in a child process: the nexmark source with --events events, the
sink replaced by discard, checkpoints on as in the file (exactly-once, every
10s). Per query it prints events/s, the CPU seconds the process used (user +
system, from the OS), events/s per core, and Flink's published per-core
figure. The stateful queries (q3, q4, q5, q7, q8) run once per state backend.
Build the modules first (make wasm). QUERIES is a comma-separated list of job
names: q0, q1, q2, q3, q4, q5, q7, q8, and q0-go, q1-go, q2-go for the Go SDK.`,
		Example: "  streamd bench nexmark q0,q5 --events 10M",
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := nexmark.ParseCount(events)
			if err != nil {
				return usagef("--events: %v", err)
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			opts := nexmark.BenchOptions{Streamd: self, Dir: dir, Events: n, Queries: strings.Split(args[0], ","), Backends: strings.Split(backends, ",")}
			for _, b := range opts.Backends {
				if b != "memory" && b != "pebble" {
					return usagef("--backends: %q is not a state backend (memory, pebble)", b)
				}
			}
			for _, q := range opts.Queries {
				if _, ok := nexmark.FlinkPerCore[strings.TrimSuffix(q, "-go")]; !ok {
					return usagef("unknown query %q (want q0, q1, q2, q3, q4, q5, q7, q8, q0-go, q1-go or q2-go)", q)
				}
			}
			rows, err := nexmark.Bench(cmd.Context(), opts, func(r nexmark.BenchRow) {
				fmt.Fprintf(c.stderr, "%s (%s): %d events in %.1fs, %.1f CPU s\n", r.Job, r.Backend, r.Events, r.Wall.Seconds(), r.CPU.Seconds())
			})
			if len(rows) > 0 {
				fmt.Fprint(c.stdout, nexmark.RenderBench(rows))
			}
			return err
		},
	}
	nx.Flags().StringVar(&events, "events", "1M", "events per query run (100000, 100K, 10M)")
	nx.Flags().StringVar(&backends, "backends", "memory,pebble", "state backends of the stateful queries")
	nx.Flags().StringVar(&dir, "dir", "examples/nexmark", "the directory of the Nexmark job files and modules")
	cmd.AddCommand(nx)
	return cmd
}
