package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestIdleSourceAcrossHosts: a union of an idle nats source (an empty
// stream, idle_timeout) and a generator, spread over two hosts: the idle
// status crosses hosts over NATS, so on both hosts the watermark follows
// the generator alone and event-time timers fire.
func TestIdleSourceAcrossHosts(t *testing.T) {
	conf := testwasm.Path(t, "internal/conformance/guests/wat/conformance.wasm")
	tc := newCluster(t, 2, 2)
	js, err := jetstream.New(connect(t, tc.srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "QUIET", Subjects: []string{"quiet.>"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	job := fmt.Sprintf(`name: idle
parallelism: 2
checkpoint: {interval: 100ms, dir: chk}
operators:
  - uid: quiet
    source: {type: nats, url: "%s", stream: QUIET, watermark: {idle_timeout: 100ms}}
  - uid: busy
    source: {type: generator, rate: 2000, key: "k{k}", value: timer, keys: 50, watermark: {interval: 10ms}}
  - uid: timers
    wasm: %s
    inputs: [{from: quiet, partition: hash}, {from: busy, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [timers]
`, tc.srv.URL(), conf)
	path := filepath.Join(dir, "idle.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	id := deploy(t, tc, path, jobfile.Options{})
	defer tc.client.Cancel(context.Background(), id)
	out := filepath.Join(dir, "out")
	// Each out subtask writes what the timers subtask on its host emitted.
	fired := func(sub int) bool {
		if _, err := os.Stat(out); err != nil {
			return false
		}
		return slices.Contains(outputLinesOf(t, out, fmt.Sprintf("part-%s-%d-", id, sub)), "timer")
	}
	for deadline := time.Now().Add(60 * time.Second); !fired(0) || !fired(1); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no timer fired on both hosts in 60s (subtask 0: %v, 1: %v)", fired(0), fired(1))
		}
	}
}
