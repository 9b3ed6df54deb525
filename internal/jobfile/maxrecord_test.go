package jobfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/streamd/streamd/abi"
)

func TestMaxRecordBytes(t *testing.T) {
	const ops = `
operators:
  - uid: gen
    source: {type: generator, count: 5, value_size: 1000}
  - uid: out
    sink: {type: discard}
    inputs: [gen]
`
	for _, c := range []struct {
		head string
		opts Options
		want int
	}{
		{"", Options{}, abi.DefaultMaxRecordBytes},
		{"", Options{MaxRecordBytes: 4096}, 4096},
		{"max_record_bytes: 2048\n", Options{MaxRecordBytes: 4096}, 2048},
		{"max_record_bytes: 1073741824\n", Options{}, 1 << 30},
	} {
		job, err := LoadJob(fixture(t, c.head+ops), c.opts)
		if err != nil {
			t.Fatalf("%q %+v: %v", c.head, c.opts, err)
		}
		if job.MaxRecordBytes != c.want {
			t.Errorf("%q %+v: max_record_bytes %d, want %d", c.head, c.opts, job.MaxRecordBytes, c.want)
		}
	}
	for _, c := range []struct{ head, want string }{
		{"max_record_bytes: 0\n", "line 1: max_record_bytes: must be between 1 and 1073741824 (1 GiB), got 0"},
		{"max_record_bytes: -5\n", "line 1: max_record_bytes: must be between 1 and 1073741824 (1 GiB), got -5"},
		{"max_record_bytes: 1073741825\n", "max_record_bytes: must be between 1 and 1073741824 (1 GiB), got 1073741825"},
		{"max_record_bytes: 64MiB\n", "line 1: max_record_bytes: want an integer"},
		{"max_record_bytes: 999\n", `operator "gen" (line 4): source.value_size: 1000 bytes is over the job's max_record_bytes 999`},
	} {
		_, err := LoadJob(fixture(t, c.head+ops), Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.head, err, c.want)
		}
	}
	if _, err := FilterJob(Filter{Module: "x.wasm", MaxRecordBytes: -1}); err == nil || !strings.Contains(err.Error(), "max_record_bytes") {
		t.Errorf("filter with max_record_bytes -1: %v", err)
	}
}

// A file source may read a stream (a FIFO, a character device such as
// /dev/stdin or /dev/zero): validate accepts it without opening it (opening a
// FIFO blocks until a writer comes); the runtime reads it with bounded
// memory. A directory is refused.
func TestFileSourceOnStreams(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	job := func(path string) string {
		return "name: s\noperators:\n  - uid: in\n    source: {type: file, path: " + path + "}\n  - uid: out\n    sink: {type: discard}\n    inputs: [in]\n"
	}
	for _, p := range []string{fifo, "/dev/zero"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if _, err := ParseJob([]byte(job(p)), dir, Options{}); err != nil {
			t.Errorf("file source on %s: %v", p, err)
		}
	}
	if _, err := ParseJob([]byte(job(dir)), dir, Options{}); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("file source on a directory: %v", err)
	}
}
