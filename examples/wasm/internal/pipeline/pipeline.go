// Package pipeline runs the examples' jobs natively for their tests: input
// records go through the keyby stage (examples/wasm/internal/keyby, one
// subtask per input) and a hash edge into the subtasks of the example's
// operator, each a streamdtest harness, with the watermarks the keyby stage
// emits, in the order a single keyby subtask sends them.
package pipeline

import (
	"fmt"
	"math"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/streamdtest"

	"github.com/streamd/streamd/examples/wasm/internal/keyby"
)

// Input is one input of the operator: its records (value and event time, as
// a file source with timestamp: {field: ts} makes them) and the config of
// its keyby stage.
type Input struct {
	Records []streamd.Record
	KeyBy   streamd.Config
}

// Job is the operator under test.
type Job struct {
	New         func() streamd.Operator
	Parallelism int
	Config      streamd.Config
	AllowClock  bool
	Sides       []string // side outputs to collect
	// SnapshotAfter, when > 0, snapshots every subtask after that many input
	// records, and restores them at RestoreParallelism (a stop with a
	// savepoint and a rescaled restart).
	SnapshotAfter      int
	RestoreParallelism int
}

// Result is what the operator's subtasks emitted, in subtask order.
type Result struct {
	Output []streamd.Record
	Side   map[string][]streamd.Record
}

// Run runs the job over the inputs, taking one record of each input in
// turn, and ends every input at the end as bounded inputs end.
func Run(job Job, inputs ...Input) (Result, error) {
	res := Result{Side: map[string][]streamd.Record{}}
	keyers := make([]*streamdtest.Harness, len(inputs))
	for i, in := range inputs {
		keyers[i] = streamdtest.New(keyby.New(), streamdtest.Options{Operator: fmt.Sprintf("keyby-%d", i), Config: in.KeyBy})
		if err := keyers[i].Open(); err != nil {
			return res, err
		}
	}
	p := job.Parallelism
	subs, err := start(job, p, len(inputs), nil)
	if err != nil {
		return res, err
	}
	last := make([]int64, len(inputs)) // the last watermark of each input
	for i := range last {
		last[i] = streamd.MinWatermark
	}
	// Every keyby output goes to its subtask; the watermarks to all.
	forward := func(i int) error {
		for _, r := range keyers[i].Output() {
			if err := subs[streamdtest.SubtaskOf(r.Key, 128, p)].ProcessElement(r, i); err != nil {
				return err
			}
		}
		for _, wm := range keyers[i].EmittedWatermarks() {
			last[i] = wm
			for _, s := range subs {
				if err := s.ProcessInputWatermark(i, wm); err != nil {
					return err
				}
			}
		}
		keyers[i].ClearOutput()
		return nil
	}
	n := 0
	for turn := 0; ; turn++ {
		more := false
		for i, in := range inputs {
			if turn >= len(in.Records) {
				continue
			}
			more = true
			if err := keyers[i].ProcessElement(in.Records[turn], 0); err != nil {
				return res, fmt.Errorf("keyby of input %d, record %d: %w", i, turn, err)
			}
			if err := forward(i); err != nil {
				return res, err
			}
			n++
			if job.SnapshotAfter > 0 && n == job.SnapshotAfter {
				collect(&res, job, subs)
				snaps := make([]streamdtest.Snapshot, len(subs))
				for j, s := range subs {
					snaps[j] = s.Snapshot(1)
					if err := s.Err(); err != nil {
						return res, err
					}
				}
				all := streamdtest.Merge(snaps...)
				p = job.RestoreParallelism
				if subs, err = start(job, p, len(inputs), &all); err != nil {
					return res, err
				}
				// The watermark starts over after a restore: the upstream
				// sends its current one again.
				for i, wm := range last {
					for _, s := range subs {
						if wm > streamd.MinWatermark {
							if err := s.ProcessInputWatermark(i, wm); err != nil {
								return res, err
							}
						}
					}
				}
			}
		}
		if !more {
			break
		}
	}
	for i := range inputs {
		for _, s := range subs {
			if err := s.ProcessInputWatermark(i, math.MaxInt64); err != nil {
				return res, err
			}
			if err := s.EndInput(i); err != nil {
				return res, err
			}
		}
	}
	for _, s := range subs {
		if err := s.Finish(); err != nil {
			return res, err
		}
	}
	collect(&res, job, subs)
	return res, nil
}

func start(job Job, p, inputs int, restore *streamdtest.Snapshot) ([]*streamdtest.Harness, error) {
	subs := make([]*streamdtest.Harness, p)
	for s := range subs {
		subs[s] = streamdtest.New(job.New(), streamdtest.Options{
			Subtask: s, Parallelism: p, NumInputs: inputs, Config: job.Config, AllowClock: job.AllowClock, Restore: restore,
		})
		if err := subs[s].Open(); err != nil {
			return nil, err
		}
	}
	return subs, nil
}

func collect(res *Result, job Job, subs []*streamdtest.Harness) {
	for _, s := range subs {
		res.Output = append(res.Output, s.Output()...)
		for _, name := range job.Sides {
			res.Side[name] = append(res.Side[name], s.SideOutput(name)...)
		}
		s.ClearOutput()
	}
}
