package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/telemetry"
)

// TestStatusShowsSourceLag: `streamd status` prints a source subtask's lag
// (records behind the end of its input, as its host reported it last) and
// nothing for subtasks without one.
func TestStatusShowsSourceLag(t *testing.T) {
	var out bytes.Buffer
	c := newCLI(strings.NewReader(""), &out, io.Discard)
	c.printStatus(&wire.JobStatus{ID: "j1", Name: "kafka-job", State: "running", Operators: []wire.OperatorStatus{
		{UID: "in", Parallelism: 2, Subtasks: []wire.SubtaskStatus{
			{Index: 0, Host: "h1", State: "running", Live: &telemetry.SubtaskLive{SourceLag: 1234, HasSourceLag: true}},
			{Index: 1, Host: "h2", State: "running", Live: &telemetry.SubtaskLive{}},
		}},
		{UID: "out", Parallelism: 1, Subtasks: []wire.SubtaskStatus{{Index: 0, Host: "h1", State: "running"}}},
	}})
	s := out.String()
	if !strings.Contains(s, "0:running@h1 (lag 1234) 1:running@h2\n") {
		t.Fatalf("status without the source's lag:\n%s", s)
	}
	if strings.Count(s, "lag") != 1 {
		t.Fatalf("status shows a lag of a subtask without one:\n%s", s)
	}
}
