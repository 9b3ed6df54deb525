package jobfile

import (
	"strings"
	"testing"
)

func TestCheckpointStorage(t *testing.T) {
	const ops = `operators:
  - uid: src
    source: {type: generator, count: 1}
  - uid: out
    sink: {type: discard}
    inputs: [src]
`
	for _, tt := range []struct {
		section, storage, bucket string
		errs                     []string
	}{
		{"checkpoint: {interval: 1s}\n", "", "", nil},
		{"checkpoint: {interval: 1s, storage: dir}\n", "dir", "", nil},
		{"checkpoint: {interval: 1s, storage: jetstream}\n", "jetstream", "", nil},
		{"checkpoint: {interval: 1s, storage: jetstream, bucket: CHK_1}\n", "jetstream", "CHK_1", nil},
		{"checkpoint: {interval: 1s, storage: s3, bucket: a.b}\n", "", "", []string{
			`line 2: checkpoint.storage: "s3": want dir or jetstream`,
			`line 2: checkpoint.bucket: "a.b": a bucket name has only letters, digits, '-' and '_'`}},
		{"checkpoint: {interval: 1s, bucket: CHK}\n", "", "", []string{`line 2: checkpoint.bucket: only with storage: jetstream`}},
	} {
		job, err := ParseJob([]byte("name: j\n"+tt.section+ops), t.TempDir(), Options{})
		if tt.errs != nil {
			for _, e := range tt.errs {
				if err == nil || !strings.Contains(err.Error(), e) {
					t.Errorf("%s: error %v, want %q", tt.section, err, e)
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.section, err)
		}
		if c := job.Checkpoint; c.Storage != tt.storage || c.Bucket != tt.bucket {
			t.Errorf("%s: storage %q bucket %q, want %q %q", tt.section, c.Storage, c.Bucket, tt.storage, tt.bucket)
		}
	}
}
