package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/checkpoint"
)

func (c *cli) inspectCommand() *cobra.Command {
	var asJSON, noVerify bool
	cmd := &cobra.Command{
		Use:   "inspect PATH",
		Short: "Print the metadata of a checkpoint or savepoint",
		Long: `Print the metadata of a checkpoint or savepoint: its id, kind, time and job, and
per operator the uid, parallelism, finished state, state size and in-flight
bytes (the channel state of an unaligned checkpoint; 0 for an aligned one).

PATH is a checkpoint directory (chk-ID), a savepoint directory, a _metadata file,
or a checkpoint root directory, which stands for the completed checkpoint or
savepoint with the highest id in it (what run --from restores from it); or a
jetstream://BUCKET/PREFIX[/chk-ID|/savepoint-ID-SUFFIX] location in the
JetStream object store of the NATS server of nats.url (--nats). The metadata checksum is always verified, and the state files' sizes and
checksums too unless --no-verify is given. A corrupt or truncated checkpoint is
refused with an error naming the file (exit status 1). See docs/checkpoint-format.md.`,
		Example: `  streamd inspect checkpoints/
  streamd inspect checkpoints/chk-12 --json
  streamd inspect --nats nats://127.0.0.1:4222 jetstream://STREAMD_CHECKPOINTS/wordcount-1a2b3c4d`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeDir,
		RunE: func(cmd *cobra.Command, args []string) error {
			md, reader, closeStore, err := c.resolveCheckpoint(cmd.Context(), args[0], "streamd inspect")
			if err != nil {
				return err
			}
			defer closeStore()
			if !noVerify {
				if reader == checkpoint.FileReader {
					err = checkpoint.Verify(md) // streams the files
				} else {
					err = checkpoint.VerifyFrom(cmd.Context(), reader, md)
				}
				if err != nil {
					return err
				}
			}
			if asJSON {
				return printInspectJSON(c.stdout, md)
			}
			printInspect(c.stdout, md)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "do not read the state files to verify their checksums")
	c.natsFlags(cmd)
	return cmd
}

func printInspect(w io.Writer, md *checkpoint.Metadata) {
	fmt.Fprintf(w, "%s %d of job %q\n", md.Kind, md.ID, md.Job)
	fmt.Fprintf(w, "time:   %s\n", md.Time.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "path:   %s\n", md.Location)
	fmt.Fprintf(w, "state:  %s\n", humanBytes(md.StateSize()))
	if shared := md.SharedFiles(); len(shared) > 0 {
		fmt.Fprintf(w, "incremental: %s full, %s written by this checkpoint (%d shared files)\n",
			humanBytes(md.FullSize()), humanBytes(md.IncrementalSize()), len(shared))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATOR\tPARALLELISM\tMAX\tFINISHED\tSTATE\tIN-FLIGHT")
	for i := range md.Operators {
		op := &md.Operators[i]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", op.UID, op.Parallelism, op.MaxParallelism, op.FinishedString(), humanBytes(op.StateSize()), humanBytes(op.InFlightBytes()))
	}
	tw.Flush()
}

// inspectJSON is the --json document (docs/checkpoint-format.md).
type inspectJSON struct {
	ID         int64              `json:"id"`
	Kind       string             `json:"kind"`
	Time       time.Time          `json:"time"`
	Job        string             `json:"job"`
	Path       string             `json:"path"`
	Version    int                `json:"format_version"`
	StateBytes int64              `json:"state_bytes"`
	InFlight   int64              `json:"inflight_bytes"`
	// Incremental checkpoints only: the whole state (blobs and every
	// shared file referred to), what this checkpoint wrote, and the count
	// of shared files.
	FullBytes        int64              `json:"full_bytes,omitempty"`
	IncrementalBytes int64              `json:"incremental_bytes,omitempty"`
	SharedFiles      int                `json:"shared_files,omitempty"`
	Operators        []inspectOperatorJ `json:"operators"`
}

type inspectOperatorJ struct {
	UID               string `json:"uid"`
	Parallelism       int    `json:"parallelism"`
	MaxParallelism    int    `json:"max_parallelism"`
	Finished          string `json:"finished"` // running | partially-finished | fully-finished
	FinishedSubtasks  int    `json:"finished_subtasks"`
	StateBytes        int64  `json:"state_bytes"`
	SubtasksWithState int    `json:"subtasks_with_state"`
	InFlight          int64  `json:"inflight_bytes"` // channel state bytes, 0 for an aligned checkpoint
}

func printInspectJSON(w io.Writer, md *checkpoint.Metadata) error {
	out := inspectJSON{ID: md.ID, Kind: string(md.Kind), Time: md.Time.UTC(), Job: md.Job, Path: md.Location,
		Version: md.Version, StateBytes: md.StateSize(), InFlight: md.InFlightBytes(), Operators: []inspectOperatorJ{}}
	if shared := md.SharedFiles(); len(shared) > 0 {
		out.FullBytes, out.IncrementalBytes, out.SharedFiles = md.FullSize(), md.IncrementalSize(), len(shared)
	}
	for i := range md.Operators {
		op := &md.Operators[i]
		n := 0
		for _, s := range op.Subtasks {
			if s.Ref != "" {
				n++
			}
		}
		out.Operators = append(out.Operators, inspectOperatorJ{UID: op.UID, Parallelism: op.Parallelism,
			MaxParallelism: op.MaxParallelism, Finished: finishedWord(op), FinishedSubtasks: op.FinishedSubtasks(),
			StateBytes: op.StateSize(), SubtasksWithState: n, InFlight: op.InFlightBytes()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func finishedWord(op *checkpoint.OperatorMeta) string {
	b, _ := op.MarshalJSON()
	var j struct{ Finished string }
	_ = json.Unmarshal(b, &j)
	return j.Finished
}

// humanBytes prints n as "123 B", "4.5 KiB", "110.6 MiB".
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
