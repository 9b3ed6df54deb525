package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
)

// writeTestCheckpoint writes a real checkpoint of src(2, fully finished) ->
// count(3, subtask 1 finished) -> sink(2) into a new root directory.
func writeTestCheckpoint(t *testing.T, id int64) (root string, md *checkpoint.Metadata) {
	t.Helper()
	return writeTestCheckpointWith(t, id, nil)
}

// writeTestCheckpointWith is writeTestCheckpoint with channel state ch in
// subtask 0 of count (nil: an aligned checkpoint).
func writeTestCheckpointWith(t *testing.T, id int64, ch *checkpoint.ChannelState) (root string, md *checkpoint.Metadata) {
	t.Helper()
	root = t.TempDir()
	d, err := checkpoint.OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	g, err := control.NewJobGraph("wordcount", []*control.Vertex{
		{UID: "src", Parallelism: 2, Kind: control.KindSource},
		{UID: "count", Parallelism: 3, Kind: control.KindOperator, Inputs: []control.Edge{{From: "src", Partition: control.Hash}}},
		{UID: "sink", Parallelism: 2, Kind: control.KindSink, Inputs: []control.Edge{{From: "count", Partition: control.Rebalance}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ack := func(op string, i int, s *checkpoint.SubtaskState) control.AckedState {
		sub := control.SubtaskID{Operator: op, Index: i}
		ref, err := checkpoint.WriteSubtaskState(ctx, d, control.KindCheckpoint, id, sub, s)
		if err != nil {
			t.Fatal(err)
		}
		return control.AckedState{Subtask: sub, StateRef: ref.String(), Size: ref.Size}
	}
	a := control.PersistMetadata{ID: id, Kind: control.KindCheckpoint,
		Acks: []control.AckedState{
			ack("count", 0, &checkpoint.SubtaskState{SinkPending: make([]byte, 2000), Channels: ch}),
			ack("count", 2, &checkpoint.SubtaskState{SinkPending: []byte("x")}),
			ack("sink", 0, &checkpoint.SubtaskState{SinkPending: []byte("txn")}),
			ack("sink", 1, &checkpoint.SubtaskState{SinkPending: []byte("txn")}),
		},
		Finished:          []control.SubtaskID{{Operator: "src", Index: 0}, {Operator: "src", Index: 1}, {Operator: "count", Index: 1}},
		FullyFinished:     []string{"src"},
		PartiallyFinished: []string{"count"},
	}
	md, err = checkpoint.NewMetadata(g, a, time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(ctx, md); err != nil {
		t.Fatal(err)
	}
	return root, md
}

func TestInspect(t *testing.T) {
	root, md := writeTestCheckpoint(t, 12)
	for _, path := range []string{root, md.Location, filepath.Join(md.Location, "_metadata")} {
		code, _, out, stderr := invoke(t, "inspect", path)
		if code != 0 {
			t.Fatalf("inspect %s: exit %d: %s", path, code, stderr)
		}
		for _, want := range []string{
			`checkpoint 12 of job "wordcount"`,
			"time:   2025-03-01T12:00:00Z",
			"path:   " + md.Location,
			"OPERATOR  PARALLELISM  MAX  FINISHED            STATE    IN-FLIGHT",
			"src       2            128  fully               0 B      0 B",
			"count     3            128  partially (1 of 3)  2.0 KiB  0 B",
			"sink      2            128  running             56 B     0 B",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("inspect %s: output lacks %q:\n%s", path, want, out)
			}
		}
	}

	code, _, out, stderr := invoke(t, "inspect", "--json", root)
	if code != 0 {
		t.Fatalf("inspect --json: exit %d: %s", code, stderr)
	}
	var j inspectJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, out)
	}
	if j.ID != 12 || j.Kind != "checkpoint" || j.Job != "wordcount" || len(j.Operators) != 3 || j.Version != 1 {
		t.Fatalf("--json: %+v", j)
	}
	if c := j.Operators[1]; c.UID != "count" || c.Finished != "partially-finished" || c.FinishedSubtasks != 1 || c.Parallelism != 3 || c.StateBytes != md.Operators[1].StateSize() {
		t.Errorf("--json count: %+v", c)
	}
	if s := j.Operators[0]; s.Finished != "fully-finished" || s.StateBytes != 0 || s.FinishedSubtasks != 2 {
		t.Errorf("--json src: %+v", s)
	}
	if j.InFlight != 0 || !strings.Contains(out, `"inflight_bytes": 0`) {
		t.Errorf("--json of an aligned checkpoint: inflight_bytes %d, want 0:\n%s", j.InFlight, out)
	}
}

// An unaligned checkpoint: in-flight bytes per operator, format version 2.
func TestInspectInFlight(t *testing.T) {
	ch := &checkpoint.ChannelState{Inputs: []checkpoint.ChannelData{{Operator: "src", Subtask: 1, Elements: []checkpoint.Element{
		checkpoint.RecordElement(abi.Record{Key: []byte("k"), Value: make([]byte, 3000), Timestamp: 1}), checkpoint.WatermarkElement(1)}}}}
	root, md := writeTestCheckpointWith(t, 12, ch)
	code, _, out, stderr := invoke(t, "inspect", root)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	if want := "count     3            128  partially (1 of 3)  5.0 KiB  3.0 KiB"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	code, _, out, stderr = invoke(t, "inspect", "--json", root)
	if code != 0 {
		t.Fatalf("inspect --json: exit %d: %s", code, stderr)
	}
	var j inspectJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, out)
	}
	if j.Version != 2 || j.InFlight != ch.EncodedSize() || j.Operators[1].InFlight != ch.EncodedSize() || j.Operators[2].InFlight != 0 || md.InFlightBytes() != ch.EncodedSize() {
		t.Fatalf("--json: version %d, inflight_bytes %d, count %d, sink %d; want 2, %d, %d, 0", j.Version, j.InFlight, j.Operators[1].InFlight, j.Operators[2].InFlight, ch.EncodedSize(), ch.EncodedSize())
	}
}

// A root directory stands for what run --from takes from it: the newest
// completed checkpoint or savepoint by id, here the savepoint 13 written
// after checkpoint 12.
func TestInspectNewestIsSavepoint(t *testing.T) {
	root, _ := writeTestCheckpoint(t, 12)
	d, err := checkpoint.OpenDir(root, checkpoint.WithRetain(2))
	if err != nil {
		t.Fatal(err)
	}
	sp := &checkpoint.Metadata{Version: checkpoint.FormatVersion, Job: "wordcount", ID: 13, Kind: control.KindSavepoint,
		Time: time.Date(2025, 3, 1, 12, 0, 1, 0, time.UTC), Operators: []checkpoint.OperatorMeta{{UID: "src", Parallelism: 1, MaxParallelism: 128, Subtasks: []checkpoint.SubtaskMeta{{Index: 0}}}}}
	if err := d.Commit(context.Background(), sp); err != nil {
		t.Fatal(err)
	}
	code, _, out, stderr := invoke(t, "inspect", "--json", root)
	if code != 0 {
		t.Fatalf("inspect --json %s: exit %d: %s", root, code, stderr)
	}
	var j inspectJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, out)
	}
	if j.ID != 13 || j.Kind != "savepoint" || j.Path != sp.Location {
		t.Fatalf("inspect %s = %s %d at %s, want savepoint 13 at %s", root, j.Kind, j.ID, j.Path, sp.Location)
	}
}

func TestInspectErrors(t *testing.T) {
	empty := t.TempDir()
	code, _, _, stderr := invoke(t, "inspect", empty)
	if code != exitFailed || !strings.Contains(stderr, "no completed checkpoint in "+empty) {
		t.Errorf("empty dir: exit %d, %s", code, stderr)
	}

	root, md := writeTestCheckpoint(t, 3)
	blob := filepath.Join(md.Location, md.Operators[1].Subtasks[0].Ref)
	data, _ := os.ReadFile(blob)
	must(t, os.WriteFile(blob, data[:100], 0o644))
	code, _, _, stderr = invoke(t, "inspect", root)
	if code != exitFailed || !strings.Contains(stderr, blob+": truncated") {
		t.Errorf("truncated blob: exit %d, %s", code, stderr)
	}
	// --no-verify reads only the metadata.
	if code, _, _, stderr = invoke(t, "inspect", "--no-verify", root); code != 0 {
		t.Errorf("--no-verify: exit %d, %s", code, stderr)
	}

	meta := filepath.Join(md.Location, "_metadata")
	data, _ = os.ReadFile(meta)
	data[len(data)-5] ^= 1
	must(t, os.WriteFile(meta, data, 0o644))
	code, _, _, stderr = invoke(t, "inspect", md.Location)
	if code != exitFailed || !strings.Contains(stderr, meta+": checksum mismatch") {
		t.Errorf("corrupt metadata: exit %d, %s", code, stderr)
	}

	if code, _, _, _ = invoke(t, "inspect"); code != exitUsage {
		t.Errorf("no argument: exit %d, want %d", code, exitUsage)
	}
}
