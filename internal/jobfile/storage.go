package jobfile

import (
	"regexp"

	"gopkg.in/yaml.v3"
)

// Checkpoint storages (checkpoint.storage).
const (
	// StorageDir keeps checkpoints in the directory checkpoint.dir.
	StorageDir = "dir"
	// StorageJetStream keeps checkpoints in a NATS JetStream object store
	// (checkpoint.bucket), under the job's name: no shared disk between
	// the hosts of a deployed job.
	StorageJetStream = "jetstream"
)

var bucketNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// checkpointStorage reads checkpoint.storage and checkpoint.bucket.
func (p *parser) checkpointStorage(c *CheckpointSettings, f map[string]*yaml.Node) {
	const prefix = "checkpoint."
	if x := f["storage"]; x != nil {
		c.Storage = p.str("", prefix+"storage", x)
		if c.Storage != StorageDir && c.Storage != StorageJetStream {
			p.add("", x.Line, prefix+"storage", "%q: want dir or jetstream", c.Storage)
		}
	}
	if x := f["bucket"]; x != nil {
		c.Bucket = p.str("", prefix+"bucket", x)
		switch {
		case !bucketNameRE.MatchString(c.Bucket):
			p.add("", x.Line, prefix+"bucket", "%q: a bucket name has only letters, digits, '-' and '_'", c.Bucket)
		case c.Storage != StorageJetStream:
			p.add("", x.Line, prefix+"bucket", "only with storage: jetstream")
		}
	}
}
