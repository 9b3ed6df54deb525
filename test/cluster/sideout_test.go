package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestSideOutputAcrossHosts: a side-output edge (from: split.side) whose
// channels cross hosts over NATS, spread over two hosts with checkpoints:
// both sinks get exactly their records.
func TestSideOutputAcrossHosts(t *testing.T) {
	wasm := testwasm.Path(t, "internal/conformance/guests/wat/sideout.wasm")
	const n = 10000
	dir := t.TempDir()
	job := fmt.Sprintf(`name: sideout
parallelism: 4
checkpoint: {interval: 100ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: 20000, keys: 1000}
  - uid: split
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: main
    sink: {type: file, path: main/}
    inputs: [split]
  - uid: side
    sink: {type: file, path: side/}
    inputs: [{from: split.side, partition: hash}]
`, n, wasm)
	path := filepath.Join(dir, "sideout.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := newCluster(t, 2, 2)
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	if len(st.Hosts) != 2 {
		t.Fatalf("job on hosts %v, want two (channels between them)", st.Hosts)
	}
	var wantMain, wantSide []string
	for i := 0; i < n; i++ {
		if v := fmt.Sprintf("value-%d", i); i%2 == 1 {
			wantSide = append(wantSide, v)
		} else {
			wantMain = append(wantMain, v)
		}
	}
	sameSorted(t, "main", outputLines(t, filepath.Join(dir, "main")), wantMain)
	sameSorted(t, "side", outputLines(t, filepath.Join(dir, "side")), wantSide)
}

func sameSorted(t *testing.T, what string, got, want []string) {
	t.Helper()
	m := map[string]int{}
	for _, l := range got {
		m[l]++
	}
	for _, w := range want {
		if m[w] != 1 {
			t.Fatalf("%s: %q %d times, want once (%d lines, want %d)", what, w, m[w], len(got), len(want))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d lines, want %d", what, len(got), len(want))
	}
}
