package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runtime.max_record_bytes is the max_record_bytes of job files that set
// none; out-of-range values are refused naming the key, and a job file's
// own max_record_bytes wins.
func TestMaxRecordBytesConfig(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	job := filepath.Join(dir, "job.yaml")
	write := func(extra string) {
		must(t, os.WriteFile(job, []byte("name: j\n"+extra+"operators:\n  - uid: gen\n    source: {type: generator, count: 5, value_size: 2000}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gen]\n"), 0o644))
	}
	write("")
	for _, c := range []struct {
		env, want string
	}{
		{"0", "runtime.max_record_bytes: 0 bytes: want 1 to 1073741824 (1 GiB)"},
		{"-1", "runtime.max_record_bytes: -1 bytes: want 1 to 1073741824 (1 GiB)"},
		{"2000000000", "runtime.max_record_bytes: 2000000000 bytes: want 1 to 1073741824 (1 GiB)"},
		{"lots", "runtime.max_record_bytes: want an integer number of bytes, got lots"},
		{"1999", `source.value_size: 2000 bytes is over the job's max_record_bytes 1999`},
	} {
		t.Setenv("STREAMD_RUNTIME_MAX_RECORD_BYTES", c.env)
		code, _, _, stderr := invoke(t, "validate", job)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("STREAMD_RUNTIME_MAX_RECORD_BYTES=%s: exit %d, stderr %q; want %q", c.env, code, stderr, c.want)
		}
	}
	t.Setenv("STREAMD_RUNTIME_MAX_RECORD_BYTES", "1999")
	write("max_record_bytes: 4000\n")
	if code, _, stdout, stderr := invoke(t, "validate", job); code != 0 || !strings.Contains(stdout, "max_record_bytes: 4000\n") {
		t.Errorf("the job file's max_record_bytes should win: exit %d: %s%s", code, stdout, stderr)
	}
}
