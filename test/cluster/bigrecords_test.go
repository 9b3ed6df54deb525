package cluster_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// bigRecordJob writes a job file: a generator of n records with key and a
// value of size bytes ("value-<n>" padded with '.'), rebalanced into the
// uppercase module at parallelism 2 (each generator subtask sends to both
// upper subtasks, so with one slot per host records cross hosts both ways),
// into a file sink; extra is added to the job's fields.
func bigRecordJob(t *testing.T, n, size int, key, extra string) string {
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	dir := t.TempDir()
	value := "value-{n}"
	if size == 0 {
		value = ""
	}
	job := fmt.Sprintf(`name: big
parallelism: 2
%s
operators:
  - uid: gen
    source: {type: generator, count: %d, key: "%s", value: "%s", value_size: %d}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: rebalance}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: upper}]
`, extra, n, key, value, size, wasm)
	path := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sinkLines reads every committed file of a file sink directory and returns
// its lines (empty ones too), in no particular order.
func sinkLines(t *testing.T, dir string) [][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var lines [][]byte
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for len(b) > 0 {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				t.Fatalf("%s ends without a newline", e.Name())
			}
			lines = append(lines, b[:i])
			b = b[i+1:]
		}
	}
	return lines
}

// TestBigRecordsAcrossHosts: records of 0 B, 1 MiB, 8 MiB and 40 MiB go
// through a job spread over two hosts, at the embedded server's default
// max_payload (1 MiB), and come out whole. Heartbeats are 1 s: the
// controller, the hosts and the guests share this process, and a guest call
// on 40 MiB holds up the Go runtime's stop-the-world phases.
func TestBigRecordsAcrossHosts(t *testing.T) {
	tc := newClusterHB(t, time.Second)
	var execs []*agent.LocalExecutor
	for _, id := range []string{"h1", "h2"} {
		e := &agent.LocalExecutor{Engine: tc.engine}
		execs = append(execs, e)
		tc.addHostWith(id, 1, e)
	}
	tc.waitHosts(2)
	if mp := connect(t, tc.srv.URL()).MaxPayload(); mp != 1<<20 {
		t.Fatalf("server max_payload %d, want the default 1 MiB", mp)
	}
	const n = 4
	for _, size := range []int{0, 1 << 20, 8 << 20, 40 << 20} {
		t.Run(fmt.Sprintf("%d_bytes", size), func(t *testing.T) {
			parent := tc.t
			tc.t = t // waitJob and deploy fail this subtest
			defer func() { tc.t = parent }()
			parts := execs[0].SenderStats().Parts + execs[1].SenderStats().Parts
			path := bigRecordJob(t, n, size, "", "")
			id := deploy(t, tc, path, jobfile.Options{})
			st := tc.waitJob(id, "finished", state(wire.JobFinished))
			if st.State != wire.JobFinished {
				t.Fatalf("job %s: %s", st.State, st.Reason)
			}
			if len(st.Hosts) != 2 {
				t.Fatalf("job ran on %v, want two hosts", st.Hosts)
			}
			lines := sinkLines(t, filepath.Join(filepath.Dir(path), "out"))
			if len(lines) != n {
				t.Fatalf("%d output lines, want %d", len(lines), n)
			}
			seen := map[string]bool{}
			for _, l := range lines {
				if len(l) != size {
					t.Fatalf("an output record of %d bytes, want %d", len(l), size)
				}
				if size == 0 {
					continue
				}
				head, pad, _ := bytes.Cut(l, []byte("."))
				if !bytes.HasPrefix(head, []byte("VALUE-")) || len(bytes.Trim(pad, ".")) != 0 {
					t.Fatalf("output record %.20q... is not an upper-cased generator value", l)
				}
				seen[string(head)] = true
			}
			if size > 0 && len(seen) != n {
				t.Errorf("distinct records %v, want %d", seen, n)
			}
			if got := execs[0].SenderStats().Parts + execs[1].SenderStats().Parts - parts; size >= 1<<20 && got == 0 {
				t.Errorf("no record parts crossed hosts")
			}
		})
	}
}

// TestRecordOverMaxRecordBytesFailsJob: a generator whose records are one
// byte over the job's max_record_bytes (the value fits, the key pushes it
// over) fails the deployed job with a reason naming the operator, the
// subtask and the size.
func TestRecordOverMaxRecordBytesFailsJob(t *testing.T) {
	tc := newCluster(t, 1, 1)
	path := bigRecordJob(t, 10, 1000, "k", "max_record_bytes: 1000")
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "failed", state(wire.JobFailed))
	if st.State != wire.JobFailed {
		t.Fatalf("job %s, want failed", st.State)
	}
	for _, want := range []string{`operator "gen" subtask `, "record too large", "a record of 1001 bytes (key 1, value 1000) is over max_record_bytes 1000"} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("reason %q does not say %q", st.Reason, want)
		}
	}
	if lines := sinkLines(t, filepath.Join(filepath.Dir(path), "out")); len(lines) != 0 {
		t.Errorf("%d records committed by a failed job", len(lines))
	}
}
