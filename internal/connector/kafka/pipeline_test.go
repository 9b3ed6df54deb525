package kafka

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
)

// pipelineCheckpoint is a completed checkpoint of the test pipeline: the
// sources' positions and the sinks' PreCommit states, by subtask.
type pipelineCheckpoint struct {
	id        int64
	positions [][]byte
	states    [][]byte
}

// runPipeline drives Kafka -> Source -> Sink -> Kafka the way the runtime
// does (a source subtask feeds the sink subtask of its index; a
// checkpoint takes every source's position and every sink's PreCommit;
// once it is complete every sink commits), and crashes it crashes times at
// random points: before a checkpoint completes, after it completed but
// before any sink committed, in the middle of a sink's commit (records
// produced, or marker added, transaction left open), and after the commits.
// Each attempt restores the latest completed checkpoint at the next
// parallelism of parallelisms (positions redistributed, sink states of old
// j to new j mod p, CommitPending first). It returns when the sources have
// read all n input records and a checkpoint after that is committed.
func runPipeline(t *testing.T, c *kafkatest.Cluster, n int, parallelisms []int, crashes int, rng *rand.Rand, skipMarker bool) {
	t.Helper()
	ctx := testCtx(t)
	var last *pipelineCheckpoint // latest completed checkpoint
	var id int64
	lastP := 0
	points := map[string]int{}
	for attempt := 0; ; attempt++ {
		p := parallelisms[min(attempt, len(parallelisms)-1)]
		var positions [][]byte
		states := make([][][]byte, p)
		if last != nil {
			var err error
			if positions, err = RedistributePositions(last.positions, p); err != nil {
				t.Fatal(err)
			}
			for j, st := range last.states {
				states[j%p] = append(states[j%p], st)
			}
		}
		srcs := make([]*Source, p)
		sinks := make([]*Sink, p)
		for i := range p {
			var pos []byte
			if positions != nil {
				pos = positions[i]
			}
			src, err := NewSource(ctx, srcConfig(c, "in"), i, p, pos)
			if err != nil {
				t.Fatal(err)
			}
			srcs[i] = src
			sink, err := NewSink(ctx, sinkConfig(c, "out"), i, p)
			if err != nil {
				t.Fatal(err)
			}
			sink.skipMarkerCheck = skipMarker
			if err := sink.CommitPending(states[i]); err != nil {
				t.Fatalf("attempt %d (parallelism %d) subtask %d: restore: %v", attempt, p, i, err)
			}
			sinks[i] = sink
		}
		closeAll := func() {
			for i := range p {
				srcs[i].Close()
				sinks[i].Close()
			}
		}
		if lastP != p {
			t.Logf("attempt %d: parallelism %d", attempt, p)
			lastP = p
		}
		crashing := attempt < crashes
		// The crash of this attempt: after how many checkpoints, and where.
		after := rng.IntN(3)
		point := []string{"before-complete", "before-commit", hookProduced, hookMarked, "after-commit", "mid-epoch"}[rng.IntN(6)]
		buf := make([]abi.Record, 25)
		done := false
		for round := 0; ; round++ {
			// Each source subtask reads what it has, into its sink.
			for i, src := range srcs {
				if read(t, ctx, src, buf, sinks[i]) == 0 {
					continue
				}
			}
			if round%3 != 2 {
				continue
			}
			// A checkpoint.
			id++
			ck := &pipelineCheckpoint{id: id}
			for i := range p {
				ck.positions = append(ck.positions, srcs[i].Position())
				st, err := sinks[i].PreCommit(id)
				if err != nil {
					t.Fatal(err)
				}
				ck.states = append(ck.states, st)
			}
			done = consumed(t, ck.positions) == n
			crashNow := crashing && after == 0
			after--
			if crashNow && point == "before-complete" {
				points[point]++
				break
			}
			last = ck
			if crashNow && point == "before-commit" {
				points[point]++
				break
			}
			victim := rng.IntN(p)
			if crashNow && (point == hookProduced || point == hookMarked) {
				sinks[victim].failHook = func(at string, _ *entry) error {
					if at == point {
						return crash
					}
					return nil
				}
			}
			crashed := false
			for i := range p {
				if err := commitNow(sinks[i], id); err != nil {
					if crashNow && i == victim {
						crashed = true
						break
					}
					t.Fatal(err)
				}
			}
			if crashNow {
				points[point]++
			}
			if crashed || crashNow {
				if point == "mid-epoch" { // records read after the checkpoint are lost with the crash
					for i, src := range srcs {
						read(t, ctx, src, buf, sinks[i])
					}
				}
				break
			}
			if done && !crashing {
				closeAll()
				t.Logf("%d attempts, %d checkpoints; crashes: %v", attempt+1, id, points)
				return
			}
		}
		closeAll()
	}
}

// read moves what src has within a short wait into sink; the records it
// returns.
func read(t *testing.T, ctx context.Context, src *Source, buf []abi.Record, sink *Sink) int {
	t.Helper()
	if !src.Ready() {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		ctx = rctx
	}
	k, err := src.Read(ctx, buf)
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		t.Fatal(err)
	}
	if err := sink.Write(buf[:k]); err != nil {
		t.Fatal(err)
	}
	return k
}

// consumed is the number of input records before the positions.
func consumed(t *testing.T, positions [][]byte) int {
	n := 0
	for _, b := range positions {
		m, err := DecodePosition(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, off := range m {
			n += int(off)
		}
	}
	return n
}

func pipelineInput(t *testing.T, n int) (*kafkatest.Cluster, []string) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 4)
	c.CreateTopic(t, "out", 4)
	produceN(t, c, "in", 4, 0, n, 1_000)
	var want []string
	for i := range n {
		want = append(want, "v"+strconv.Itoa(i))
	}
	return c, want
}

// TestPipelineExactlyOnceUnderCrashes: 20 crashes at random points, with
// rescaling 2 -> 3 -> 1 on the way; a read_committed consumer sees every
// input record exactly once.
func TestPipelineExactlyOnceUnderCrashes(t *testing.T) {
	const n = 6000
	c, want := pipelineInput(t, n)
	rng := rand.New(rand.NewPCG(25, 1))
	runPipeline(t, c, n, []int{2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 1}, 20, rng, false)
	exactlyOnce(t, c, "out", sortedStrings(want))
}

// TestPipelineWithoutMarkerDuplicates runs the same pipeline with the
// sinks' marker check left out: the output then has duplicates, so the
// test above can tell a sink that is not exactly once.
func TestPipelineWithoutMarkerDuplicates(t *testing.T) {
	const n = 6000
	c, want := pipelineInput(t, n)
	rng := rand.New(rand.NewPCG(25, 1))
	runPipeline(t, c, n, []int{2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 1}, 20, rng, true)
	got := committed(t, c, "out")
	if len(got) <= len(want) {
		t.Fatalf("without the marker check the output has %d records for %d inputs: no duplicate", len(got), len(want))
	}
	t.Logf("without the marker check: %d records for %d inputs", len(got), len(want))
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	slices.Sort(out)
	return out
}
