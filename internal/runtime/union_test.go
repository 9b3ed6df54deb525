package runtime

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
)

// abortLog is a slog handler that keeps the driver's "checkpoint aborted"
// lines: checkpoint id and reason.
type abortLog struct {
	mu     sync.Mutex
	aborts []string // "<id>:<reason>"
	wake   chan struct{}
}

func (h *abortLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *abortLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *abortLog) WithGroup(string) slog.Handler            { return h }
func (h *abortLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "checkpoint aborted" {
		return nil
	}
	var id, reason string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "id":
			id = a.Value.String()
		case "reason":
			reason = a.Value.String()
		}
		return true
	})
	h.mu.Lock()
	h.aborts = append(h.aborts, id+":"+reason)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return nil
}

func (h *abortLog) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.aborts...)
}

// TestUnionStatePartiallyFinished: the wasm conformance operator writes
// union list state ("ckpt") in every snapshot. Its two subtasks get uneven
// input over a forward edge from a file source reading stdin (only subtask
// 0 reads it, subtask 1 ends at once), so subtask 1 reaches end of data
// (end_input, finish) long before subtask 0. While the operator is
// partially finished every checkpoint is refused (aborted, reason
// union-state), not counted as a failure: with tolerable_failures 0 the job
// would fail on the first counted one. Subtask 1 keeps waiting for its final
// checkpoint; once stdin ends, both subtasks finish on the same later
// checkpoint, with the operator fully finished, and the file sink holds
// every record exactly once.
func TestUnionStatePartiallyFinished(t *testing.T) {
	mod := testwasm.Path(t, "internal/conformance/guests/wat/conformance.wasm")
	eng := cachedEngine(t)
	const minLines = 100
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	g := graph(t,
		src("src", 2, &jobfile.SourceSpec{Type: "file", Path: "-"}),
		op("key", 2, NativeFactory(newOwnKey), in("src", control.Forward)),
		op("op", 2, &jobfile.WasmSpec{Path: mod}, in("key", control.Forward)),
		sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: out}, in("op", control.Forward)),
	)
	pr, pw := io.Pipe()
	defer pr.Close()
	logs := &abortLog{wake: make(chan struct{}, 1)}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	zero := 0
	type done struct {
		stats Stats
		err   error
	}
	var completed []*checkpoint.Metadata
	var mu sync.Mutex
	res := make(chan done, 1)
	go func() {
		stats, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 16, Stdin: pr, Logger: slog.New(logs), TracerProvider: tp,
			Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 30 * time.Millisecond, Tick: 10 * time.Millisecond,
				TolerableFailures: &zero,
				OnComplete: func(md *checkpoint.Metadata) {
					mu.Lock()
					completed = append(completed, md)
					mu.Unlock()
				}}})
		res <- done{stats, err}
	}()
	// Subtask 0's input: a line every 5 ms (a source blocked reading stdin
	// takes no barrier, so the lines keep coming) until checkpoints have
	// been refused for the union state a few times.
	enough := make(chan struct{})
	written := make(chan []string, 1)
	go func() {
		var lines []string
		defer func() { pw.Close(); written <- lines }()
		for i := 0; ; i++ {
			l := fmt.Sprintf("line-%04d", i)
			if _, err := io.WriteString(pw, l+"\n"); err != nil {
				t.Error(err)
				return
			}
			lines = append(lines, l)
			select {
			case <-enough:
				if i >= minLines {
					return
				}
			default:
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	deadline := time.After(20 * time.Second)
	for n := 0; n < 3; {
		select {
		case <-logs.wake:
			n = 0
			for _, a := range logs.get() {
				if strings.HasSuffix(a, ":"+string(control.AbortUnionState)) {
					n++
				}
			}
		case r := <-res:
			t.Fatalf("the job ended while subtask 0 still had input: %v", r.err)
		case <-deadline:
			t.Fatalf("no union-state aborts after 20s; aborts %v", logs.get())
		}
	}
	close(enough)
	lines := <-written
	var r done
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not finish 30s after its input ended")
	}
	if r.err != nil {
		t.Fatalf("job failed: %v (aborts %v)", r.err, logs.get())
	}
	if r.stats.Restarts != 0 {
		t.Fatalf("%d restarts, want 0", r.stats.Restarts)
	}
	aborts := logs.get()
	for _, a := range aborts {
		if !strings.HasSuffix(a, ":"+string(control.AbortUnionState)) {
			t.Errorf("checkpoint aborted for another reason: %s (all: %v)", a, aborts)
		}
	}

	// No completed checkpoint has the operator partially finished; the last
	// one has it fully finished.
	mu.Lock()
	defer mu.Unlock()
	if len(completed) == 0 {
		t.Fatal("no checkpoint completed")
	}
	for _, md := range completed {
		for _, o := range md.Operators {
			if o.UID == "op" && o.Finished == control.OperatorPartiallyFinished {
				t.Fatalf("checkpoint %d completed with op partially finished", md.ID)
			}
		}
	}
	last := completed[len(completed)-1]
	for _, o := range last.Operators {
		if o.Finished != control.OperatorFullyFinished {
			t.Fatalf("final checkpoint %d: %s is %s, want fully finished", last.ID, o.UID, o.Finished)
		}
	}
	// Both subtasks of op waited for the same (final) checkpoint; subtask 1
	// began waiting before subtask 0 reached end of data.
	waits := map[int64]tracetest.SpanStub{}
	for _, s := range spans(exp.GetSpans()).named(telemetry.SpanFinalCheckpointWait) {
		if v, _ := attr(s, telemetry.AttrOperator); v.AsString() == "op" {
			waits[attrInt(t, s, telemetry.AttrSubtask)] = s
		}
	}
	if len(waits) != 2 {
		t.Fatalf("final-checkpoint waits of op: %d, want 2", len(waits))
	}
	for sub, s := range waits {
		if id := attrInt(t, s, telemetry.AttrCheckpointID); id != last.ID {
			t.Errorf("op[%d] finished on checkpoint %d, want the final one %d", sub, id, last.ID)
		}
	}
	if !waits[1].StartTime.Before(waits[0].StartTime) || waits[0].StartTime.Sub(waits[1].StartTime) < 50*time.Millisecond {
		t.Errorf("op[1] began waiting at %v, op[0] at %v: want op[1] well before", waits[1].StartTime, waits[0].StartTime)
	}
	var unionAborts int
	for _, a := range aborts {
		id, _ := strconv.ParseInt(strings.Split(a, ":")[0], 10, 64)
		if id < last.ID {
			unionAborts++
		}
	}
	if unionAborts < 3 {
		t.Errorf("%d union-state aborts before the final checkpoint %d, want at least 3", unionAborts, last.ID)
	}
	for _, o := range r.stats.Operators {
		if want := map[bool]int{true: len(aborts)}[o.UID == "op"]; o.UnionDeclines != want {
			t.Errorf("stats: operator %s has %d union-state declines, want %d", o.UID, o.UnionDeclines, want)
		}
	}

	// Exactly once: each sink subtask's committed files, in checkpoint
	// order, are op's output stream (conformance guests/SPEC.md).
	u64 := func(n uint64) string { return string(binary.LittleEndian.AppendUint64(nil, n)) }
	want := map[int]string{}
	var b strings.Builder
	for i, l := range lines {
		b.WriteString(l + "\x00" + u64(uint64(i+1)) + "\n")
	}
	want[0] = b.String()
	want[1] = ""
	for sub, total := range map[int]int{0: len(lines), 1: 0} {
		want[sub] += "wm\nend\x00\nfinish" + u64(uint64(total)) + "\n"
	}
	for sub := 0; sub < 2; sub++ {
		if got := sinkStream(t, out, sub); got != want[sub] {
			t.Errorf("sink subtask %d committed %d bytes, want %d:\n got %q\nwant %q", sub, len(got), len(want[sub]), tail(got), tail(want[sub]))
		}
	}
	t.Logf("%d union-state aborts, final checkpoint %d, %d completed, elapsed %v", unionAborts, last.ID, len(completed), r.stats.Elapsed)
}

// ownKey is a native operator that gives every record one key of its own
// subtask's key groups, so that a keyed operator behind a forward edge may
// use keyed state for it.
type ownKey struct {
	key []byte
	out []abi.Record
	noop
}

func newOwnKey(info SubtaskInfo) NativeOperator {
	rng := abi.RangeForSubtask(info.Subtask, info.MaxParallelism, info.Parallelism)
	for i := 0; ; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		if rng.Contains(abi.KeyGroup(k, info.MaxParallelism)) {
			return &ownKey{key: k}
		}
	}
}

func (o *ownKey) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	o.out = o.out[:0]
	for _, r := range recs {
		o.out = append(o.out, abi.Record{Key: o.key, Value: r.Value, Timestamp: r.Timestamp})
	}
	emit(o.out)
	return nil
}

// sinkStream is the committed output of file sink subtask sub: its
// part-<sub>-<id> files in checkpoint order.
func sinkStream(t *testing.T, dir string, sub int) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	type part struct {
		id   int64
		name string
	}
	var parts []part
	prefix := fmt.Sprintf("part-%d-", sub)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			id, err := strconv.ParseInt(strings.TrimPrefix(e.Name(), prefix), 10, 64)
			if err != nil {
				t.Fatalf("sink file %s: %v", e.Name(), err)
			}
			parts = append(parts, part{id, e.Name()})
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].id < parts[j].id })
	var buf bytes.Buffer
	for _, p := range parts {
		b, err := os.ReadFile(filepath.Join(dir, p.name))
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
	}
	return buf.String()
}

func tail(s string) string {
	if len(s) > 120 {
		return "..." + s[len(s)-120:]
	}
	return s
}
